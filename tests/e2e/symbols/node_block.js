// Blocks the main thread (Atomics.wait -> futex in libc) from named JS functions.
// Usage: node --perf-basic-prof node_block.js MILLISECONDS
const sab = new Int32Array(new SharedArrayBuffer(4));
function waitInJs(ms) { Atomics.wait(sab, 0, 0, ms); }
function outerLoop(n) { for (let i = 0; i < n; i++) waitInJs(10); }
const fs = require("fs");
function readSync() { try { fs.readFileSync("/dev/null"); } catch (e) {} }
console.log("ready " + process.pid);
const end = Date.now() + Number(process.argv[2] || 4000);
while (Date.now() < end) { outerLoop(20); readSync(); }
