// Rust functions whose mangled names (legacy or v0, chosen at compile time) must come out demangled.
use std::io::{self, BufRead, Write};

pub mod offcpu {
    pub mod queue {
        pub struct Drain;
        impl Drain {
            #[inline(never)]
            pub fn wait_for(&self, n: u64) -> u64 {
                n.wrapping_mul(31).wrapping_add(7)
            }
        }
        #[inline(never)]
        pub fn generic_wait<T: Copy + Into<u64>>(x: T) -> u64 {
            x.into() + 1
        }
    }
}

fn main() {
    let method: fn(&offcpu::queue::Drain, u64) -> u64 = offcpu::queue::Drain::wait_for;
    let generic: fn(u32) -> u64 = offcpu::queue::generic_wait::<u32>;
    let out = io::stdout();
    let mut out = out.lock();
    writeln!(out, "wait_for {:#x}", method as usize).unwrap();
    writeln!(out, "generic_wait {:#x}", generic as usize).unwrap();
    writeln!(out, "ready").unwrap();
    out.flush().unwrap();
    drop(out);
    for _ in io::stdin().lock().lines() {}
}
