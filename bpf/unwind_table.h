/* Layouts and constants of the user-stack unwind tables, shared by bpf/unwind.h
 * (the walk) and offcpu_exporter/unwind/layout.py (which writes the tables). Only fixed-width types;
 * tests/unit/test_unwind_layout.py compiles this header with the C compiler and checks every size,
 * offset and constant against the Python mirror.
 *
 * The tables are x86-64 DWARF CFI (.eh_frame, .debug_frame) reduced to what a return-address walk
 * needs: where the canonical frame address (CFA) is, and where the caller's rbp was saved. The
 * return address is always at CFA - 8 on x86-64. */
#ifndef UNWIND_TABLE_H
#define UNWIND_TABLE_H

/* How to find the CFA at a pc (struct unwind_row.cfa_rule). */
#define UNWIND_CFA_NONE   0 /* no CFI covers this pc: walk it with the frame pointer */
#define UNWIND_CFA_RSP    1 /* CFA = rsp + cfa_offset */
#define UNWIND_CFA_RBP    2 /* CFA = rbp + cfa_offset */
#define UNWIND_CFA_PLT    3 /* PLT stub: CFA = rsp + 8, + 8 more when (pc & 15) >= cfa_offset */
#define UNWIND_CFA_SIGNAL 4 /* rt_sigreturn trampoline: the interrupted registers are in the
                             * ucontext at rsp (the kernel's struct rt_sigframe) */
#define UNWIND_CFA_END    5 /* return address undefined (.cfi_undefined rip): the outermost frame */
#define UNWIND_CFA_BAD    6 /* CFI this form cannot express (a DWARF expression, a CFA in another
                             * register): walk it with the frame pointer, counted */

/* Where the caller's rbp is (struct unwind_row.rbp_rule). */
#define UNWIND_RBP_SAME   0 /* unchanged in this frame */
#define UNWIND_RBP_OFFSET 1 /* saved at CFA + rbp_offset */

/* One row of a table: the rules from `pc` up to the next row's pc. pc is relative to the table's
 * base (struct unwind_mapping.bias maps a process address to it), so 32 bits cover any object. */
struct unwind_row {
	__u32 pc;
	__s32 cfa_offset;
	__s16 rbp_offset;
	__u8 cfa_rule;  /* UNWIND_CFA_* */
	__u8 rbp_rule;  /* UNWIND_RBP_* */
};

/* The first-level index: the rows of one page of code (1 << UNWIND_PAGE_SHIFT bytes of table
 * addresses). `first` is the row in effect at the page's first byte, so a search never has to
 * leave its page; count is at most 1 << UNWIND_SEARCH_STEPS. */
#define UNWIND_PAGE_SHIFT   12
#define UNWIND_SEARCH_STEPS 10
struct unwind_page {
	__u32 first; /* index in unwind_rows */
	__u32 count;
};

/* One executable mapping of a process whose object has a table. */
struct unwind_mapping {
	__u64 start;      /* first address of the mapping */
	__u64 end;        /* one past its last address */
	__u64 bias;       /* table address = process address - bias */
	__u32 page_first; /* index in unwind_pages of the table's page 0 */
	__u32 page_count;
};

/* Where the mappings of one process are in unwind_mappings: entries [first, first + count), sorted
 * by start. Mappings not listed (JIT code, objects without CFI, anything past UNWIND_MAX_MAPPINGS)
 * are walked with frame pointers. Two levels rather than the mappings inline in the process entry:
 * a process with two objects (a static binary and the vDSO) then takes 72 bytes, not the 8 KiB of
 * room for UNWIND_MAX_MAPPINGS, so that the maps hold every process of a node of 10,000. */
#define UNWIND_MAX_MAPPINGS_SHIFT 8
#define UNWIND_MAX_MAPPINGS (1 << UNWIND_MAX_MAPPINGS_SHIFT)
struct unwind_process {
	__u32 first; /* index in unwind_mappings */
	__u32 count; /* at most UNWIND_MAX_MAPPINGS */
};

/* How a walk ended (struct unwind_state.end, and an index of unwind_stats). */
#define UNWIND_END_ROOT       0 /* reached a frame whose CFI says it is the outermost */
#define UNWIND_END_FP_ZERO    1 /* frame-pointer walk reached rbp == 0 (or a zero return address) */
#define UNWIND_END_DEPTH      2 /* the buffer is full: more frames were left */
#define UNWIND_END_FAULT      3 /* user memory unreadable (not paged in, or a bad address) */
#define UNWIND_END_BAD_FRAME  4 /* the stack pointer did not move up: a wrong table or rbp */
#define UNWIND_END_NO_REGS    5 /* no user registers: a kernel thread, or a 32-bit task */
#define UNWIND_END_MAX        6

/* Indices of the per-CPU unwind_stats array after the UNWIND_END_* ones. */
#define UNWIND_STAT_FRAMES_CFI    (UNWIND_END_MAX + 0) /* frames stepped with a table row */
#define UNWIND_STAT_FRAMES_FP     (UNWIND_END_MAX + 1) /* frames stepped with the frame pointer */
#define UNWIND_STAT_FRAMES_BAD    (UNWIND_END_MAX + 2) /* rows UNWIND_CFA_BAD (stepped with rbp) */
#define UNWIND_STAT_FRAMES_SIGNAL (UNWIND_END_MAX + 3) /* signal frames stepped through */
#define UNWIND_STAT_NO_PROCESS    (UNWIND_END_MAX + 4) /* walks of processes without tables */
#define UNWIND_STAT_MAX           (UNWIND_END_MAX + 5)

#endif
