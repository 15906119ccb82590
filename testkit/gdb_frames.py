# Runs inside gdb (gdb -p PID -batch -x gdb_frames.py): prints every thread's physical frames,
# newest first, as "THREAD tid" then "FRAME pc name type" lines, past main down to the entry point.
# Left out: inline frames (they share their pc with the physical frame that holds them) and the
# frames gdb infers for tail calls from DWARF call-site records: neither is on the stack.
import gdb

gdb.execute("set backtrace past-main on")
gdb.execute("set backtrace past-entry on")

for thread in sorted(gdb.selected_inferior().threads(), key=lambda t: t.ptid[1]):
    thread.switch()
    print(f"THREAD {thread.ptid[1]}")
    frame = gdb.newest_frame()
    while frame is not None:
        if frame.type() not in (gdb.INLINE_FRAME, gdb.TAILCALL_FRAME):
            print(f"FRAME {frame.pc():#x} {frame.name() or '??'} {frame.type()}")
        try:
            frame = frame.older()
        except gdb.error:
            break
