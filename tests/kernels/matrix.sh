#!/usr/bin/env bash
# Runs the kernel probe tests on each leg (a kernel, an attach mode, the headers bcc compiles
# against, a selection of tests) and prints one summary line per leg; exits non-zero when any leg
# fails. Guest legs boot a stock Debian kernel under QEMU (tests/kernels/run.sh); the host leg runs
# on this machine's kernel. See docs/kernel-matrix.md.
set -euo pipefail

# The legs CI runs (scripts/test), in the order they start: the longest first, so that two at a
# time end close together (docs/kernel-matrix.md has their times). 6.12-rt runs its own tests
# (rt: its task states, and off-CPU against the kernel's own switch record) in tracepoint mode,
# what `auto` takes there; kprobe mode skips runs there, and a skipped exit can leave a dead
# thread's block credited as in progress (docs/kernel-matrix.md, open), so its leg runs on demand
# (6.12-rt:kprobe:tests=rt); RT_LEGS are its full legs (--legs "$RT_LEGS").
DEFAULT_LEGS=host,6.12-rt:tracepoint:tests=rt,6.12:tracepoint,6.1:tracepoint,6.12:kprobe,6.12:kprobe:headers=6.1,6.1:kprobe
RT_LEGS=6.12-rt:tracepoint,6.12-rt:kprobe

# The files the matrix collects; the selections below pick tests in them by marker (pyproject.toml
# registers the markers; docs/kernel-matrix.md says which test has which and why).
TEST_FILES=(tests/e2e/test_probe.py tests/e2e/test_probe_truth.py tests/e2e/test_probe_rt.py)

# selection NAME: the pytest -m expression of a named selection of tests.
#   all     every kernel test of TEST_FILES (the host leg: native, ~1 min)
#   hook    kernel_hook: what depends on the kernel and on the attach mode (the switch hook)
#   kernel  kernel_hook or kernel_events: plus what depends on the kernel but not on the attach
#           mode (the process-event tracepoints, the perf-event tracepoint, BPF run-time stats):
#           one leg per kernel runs those, its tracepoint leg
#   truth   kernel_truth: the hook's truths against the kernel's own figures and the workloads'
#           timing, for a leg that exercises the same code as another but for one thing (the
#           headers)
#   events  kernel_events
#   rt      rt_kernel only: a PREEMPT_RT kernel's own task states, and off-CPU time against the
#           kernel's own record of the switches (where the CPU clock is no truth)
# Tests marked rt_kernel are added on a PREEMPT_RT kernel's legs and left out everywhere else; tests
# marked cpu_clock_truth are left out there: the guest's CPU clock charges runs from before their
# switch-in (docs/kernel-matrix.md).
selection() {
	case "$1" in
	all) echo kernel ;;
	hook) echo kernel_hook ;;
	kernel) echo "kernel_hook or kernel_events" ;;
	truth) echo kernel_truth ;;
	events) echo kernel_events ;;
	rt) echo rt_kernel ;;
	*) return 1 ;;
	esac
}

usage() {
	cat <<EOF
usage: tests/kernels/matrix.sh [--legs LIST] [--kernel VERSION] [--jobs N] [--timeout SECONDS]
                               [-- COMMAND...]

  --legs LIST        comma-separated legs (default: $DEFAULT_LEGS)
  --kernel VERSION   the kernel of legs that name none (default 6.1)
  --jobs N           guest legs run N at a time (default 2); the host leg always runs first, alone
  --parallel         the same as --jobs 2
  --timeout SECONDS  per guest leg (default 1500)
  --list             print each leg's summary name, selection and command, and exit
  COMMAND            what each leg runs instead of its selection of tests, in the project checkout
                     with OFFCPU_ATTACH set

A leg is "host" or KERNEL:MODE[:headers=VERSION][:tests=SELECTION]:
  KERNEL     6.1, 6.12, 6.12-rt (resolved from Debian's metapackages) or an exact ABI; may be
             left out ("kprobe"), then --kernel's
  MODE       kprobe | tracepoint
  headers=   compile against another kernel's headers (run.sh --headers), e.g. headers=6.1
  tests=     all | hook | kernel | truth | events | rt (default: host all, tracepoint kernel,
             kprobe hook, with headers= truth)
The selections run \$OFFCPU_VENV/bin/python -m pytest -p no:hypothesispytest -v -m EXPR
${TEST_FILES[*]}
(OFFCPU_VENV defaulting to the checkout's .venv).
EOF
}

log() { printf 'matrix.sh: %s\n' "$*" >&2; }
fail() { log "$*"; exit 2; }

here=$(cd "$(dirname "$0")" && pwd)
project=$(cd "$here/../.." && pwd)
legs=$DEFAULT_LEGS
default_kernel=6.1
timeout_s=1500
jobs=2
list=0

while [ $# -gt 0 ]; do
	case "$1" in
	--legs) [ $# -ge 2 ] || fail "--legs needs a value"; legs=$2; shift 2 ;;
	--kernel) [ $# -ge 2 ] || fail "--kernel needs a value"; default_kernel=$2; shift 2 ;;
	--timeout) [ $# -ge 2 ] || fail "--timeout needs a value"; timeout_s=$2; shift 2 ;;
	--jobs) [ $# -ge 2 ] || fail "--jobs needs a value"; jobs=$2; shift 2 ;;
	--parallel) jobs=2; shift ;;
	--list) list=1; shift ;;
	-h | --help) usage; exit 0 ;;
	--) shift; break ;;
	*) usage >&2; fail "unexpected argument: $1 (the command goes after --)" ;;
	esac
done
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || fail "--jobs must be a positive number, not '$jobs'"
custom=()
[ $# -eq 0 ] || custom=("$@")

# --- the legs --------------------------------------------------------------------------------
# Per leg i: spec[i] as given, lkernel[i] (resolved ABI, or "" for host), lmode[i],
# lheaders[i] (resolved ABI or ""), lexpr[i] (pytest -m expression) and lsel[i] (its name).
IFS=, read -r -a spec <<<"$legs"
[ ${#spec[@]} -gt 0 ] || fail "--legs is empty"
declare -A abi_of=()
# abi VERSION: sets REPLY to VERSION's ABI (run.sh resolves kernel lines from the mirror).
abi() {
	if [ -z "${abi_of[$1]+set}" ]; then
		abi_of[$1]=$("$here/run.sh" --kernel "$1" --print-kernel) || fail "cannot resolve the kernel '$1'"
	fi
	REPLY=${abi_of[$1]}
}
lkernel=() lmode=() lheaders=() lexpr=() lsel=()
for i in "${!spec[@]}"; do
	leg=${spec[$i]}
	if [ "$leg" = host ]; then
		k="" mode=tracepoint h="" sel=all
	else
		IFS=: read -r -a part <<<"$leg"
		case "${part[0]:-}" in
		kprobe | tracepoint) part=("$default_kernel" "${part[@]}") ;;
		esac
		[ ${#part[@]} -ge 2 ] || fail "leg '$leg': expected KERNEL:MODE[:headers=VERSION][:tests=SELECTION] or host"
		mode=${part[1]}
		case "$mode" in kprobe | tracepoint) ;; *) fail "leg '$leg': the mode must be kprobe or tracepoint, not '$mode'" ;; esac
		h="" sel=""
		for opt in "${part[@]:2}"; do
			case "$opt" in
			headers=?*) h=${opt#headers=} ;;
			tests=?*) sel=${opt#tests=} ;;
			*) fail "leg '$leg': unknown option '$opt' (headers=VERSION, tests=SELECTION)" ;;
			esac
		done
		if [ -z "$sel" ]; then
			if [ -n "$h" ]; then sel=truth; elif [ "$mode" = kprobe ]; then sel=hook; else sel=kernel; fi
		fi
		abi "${part[0]}"
		k=$REPLY
		if [ -n "$h" ]; then
			abi "$h"
			h=$REPLY
		fi
	fi
	expr=$(selection "$sel") || fail "leg '$leg': unknown selection '$sel' (all, hook, kernel, truth, events)"
	case "$k" in
	*-rt-amd64) expr="(($expr) and not cpu_clock_truth) or rt_kernel" ;;
	*) expr="($expr) and not rt_kernel" ;;
	esac
	lkernel[i]=$k lmode[i]=$mode lheaders[i]=$h lexpr[i]=$expr lsel[i]=$sel
done

if [ ${#custom[@]} -eq 0 ]; then
	venv=${OFFCPU_VENV:-$project/.venv}
	[ -x "$venv/bin/python" ] || fail "no $venv/bin/python: run scripts/setup --test or set OFFCPU_VENV"
fi

# leg_command I: the command of leg I, one word a line.
leg_command() {
	if [ ${#custom[@]} -gt 0 ]; then
		printf '%s\n' "${custom[@]}"
	else
		# Without Hypothesis' plugin, which no test here uses: importing it takes ~30 s in a guest.
		printf '%s\n' "$venv/bin/python" -m pytest -p no:hypothesispytest -v -m "${lexpr[$1]}" "${TEST_FILES[@]}"
	fi
}

leg_name() {
	local i=$1
	if [ -z "${lkernel[$i]}" ]; then
		echo "kernel $(uname -r) / tracepoint"
	elif [ -n "${lheaders[$i]}" ]; then
		echo "kernel ${lkernel[$i]} / ${lmode[$i]} (headers ${lheaders[$i]})"
	else
		echo "kernel ${lkernel[$i]} / ${lmode[$i]}"
	fi
}

# shown I: leg I's command as a shell would take it.
shown() {
	local cmd
	mapfile -t cmd < <(leg_command "$1")
	printf '%q ' "${cmd[@]}" | sed 's/ $//'
}

leg_header() {
	if [ ${#custom[@]} -gt 0 ]; then
		printf '\n=== %s: %s\n' "$(leg_name "$1")" "$(shown "$1")"
	else
		printf '\n=== %s, tests=%s: %s\n' "$(leg_name "$1")" "${lsel[$1]}" "$(shown "$1")"
	fi
}

# run_leg I: runs leg I, leaves its exit status and duration in $work/I.rc and I.seconds.
run_leg() {
	local i=$1 start end rc=0 cmd
	mapfile -t cmd < <(leg_command "$i")
	start=$(date +%s.%N)
	if [ -z "${lkernel[$i]}" ]; then
		(cd "$project" && OFFCPU_ATTACH=tracepoint "${cmd[@]}") || rc=$?
	else
		"$here/run.sh" --kernel "${lkernel[$i]}" ${lheaders[$i]:+--headers "${lheaders[$i]}"} \
			--attach "${lmode[$i]}" --timeout "$timeout_s" -- "${cmd[@]}" || rc=$?
		if [ "$rc" -eq 125 ]; then
			# The guest's kernel panicked (run.sh): the emulator's fault, not a test's; once more.
			log "$(leg_name "$i"): the guest kernel panicked; running the leg again"
			echo "guest kernel panic, rerun" >"$work/$i.note"
			rc=0
			"$here/run.sh" --kernel "${lkernel[$i]}" ${lheaders[$i]:+--headers "${lheaders[$i]}"} \
				--attach "${lmode[$i]}" --timeout "$timeout_s" -- "${cmd[@]}" || rc=$?
		fi
	fi
	end=$(date +%s.%N)
	echo "$rc" >"$work/$i.rc"
	awk -v a="$start" -v b="$end" 'BEGIN { printf "%.0f\n", b - a }' >"$work/$i.seconds"
}

if [ $list -eq 1 ]; then
	for i in "${!spec[@]}"; do
		printf '%s\t%s\t%s\n' "$(leg_name "$i")" "${lsel[$i]}" "$(shown "$i")"
	done
	exit 0
fi

work=$(mktemp -d /tmp/offcpu-matrix.XXXXXX)
declare -A running=()
cleanup() {
	local p
	for p in "${!running[@]}"; do kill "$p" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

t0=$(date +%s)
# The host leg first and alone: its tolerances are the native ones, which guests competing for
# the same two cores would break.
guests=()
for i in "${!spec[@]}"; do
	if [ -z "${lkernel[$i]}" ]; then
		leg_header "$i"
		run_leg "$i"
	else
		guests+=("$i")
	fi
done
if [ "$jobs" -eq 1 ]; then
	for i in "${guests[@]}"; do
		leg_header "$i"
		run_leg "$i"
	done
else
	# Up to $jobs guests at a time; each leg's output is printed when it ends.
	for i in "${guests[@]}"; do
		while [ ${#running[@]} -ge "$jobs" ]; do
			wait -n -p done_pid "${!running[@]}" || true
			leg_header "${running[$done_pid]}"
			cat "$work/${running[$done_pid]}.log"
			unset "running[$done_pid]"
		done
		log "starting $(leg_name "$i")"
		run_leg "$i" >"$work/$i.log" 2>&1 &
		running[$!]=$i
	done
	while [ ${#running[@]} -gt 0 ]; do
		wait -n -p done_pid "${!running[@]}" || true
		leg_header "${running[$done_pid]}"
		cat "$work/${running[$done_pid]}.log"
		unset "running[$done_pid]"
	done
fi

failed=0
printf '\n'
for i in "${!spec[@]}"; do
	rc=$(cat "$work/$i.rc" 2>/dev/null || echo 1)
	seconds=$(cat "$work/$i.seconds" 2>/dev/null || echo 0)
	note=$(cat "$work/$i.note" 2>/dev/null || true)
	if [ "$rc" = 0 ]; then
		echo "$(leg_name "$i"): passed ($seconds s${note:+; $note})"
	else
		echo "$(leg_name "$i"): FAILED ($seconds s${note:+; $note})"
		failed=1
	fi
done
echo "matrix: $(( $(date +%s) - t0 )) s in all, guest legs $jobs at a time"
exit $failed
