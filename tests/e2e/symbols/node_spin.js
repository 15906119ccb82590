// CPU-bound named JS functions: when the kernel preempts them, the user stack starts in JIT code.
// Usage: node --perf-basic-prof [--interpreted-frames-native-stack] node_spin.js MILLISECONDS
function innerSpin(n) { let x = 0; for (let i = 0; i < n; i++) x = (x * 31 + i) | 0; return x; }
function outerSpin() { let s = 0; for (let j = 0; j < 200; j++) s ^= innerSpin(100000); return s; }
console.log("ready " + process.pid);
const end = Date.now() + Number(process.argv[2] || 4000);
while (Date.now() < end) outerSpin();
