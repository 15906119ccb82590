#!/usr/bin/env bash
# Runs the kernel probe tests on each (kernel, attach mode) leg and prints one summary line per
# leg; exits non-zero when any leg fails. Legs:
#   host        this machine's kernel, --attach tracepoint, run directly (no VM)
#   kprobe      a stock Debian kernel under QEMU (tests/kernels/run.sh), --attach kprobe
#   tracepoint  the same guest kernel, --attach tracepoint
# See docs/kernel-matrix.md.
set -euo pipefail

usage() {
	cat <<'EOF'
usage: tests/kernels/matrix.sh [--legs LIST] [--kernel VERSION] [--timeout SECONDS] [--parallel]
                               [-- COMMAND...]

  --legs LIST        comma-separated subset of host,kprobe,tracepoint (default: all three)
  --kernel VERSION   guest kernel (default: resolved from linux-image-amd64, see run.sh)
  --timeout SECONDS  per guest leg (default 900: a leg takes 6-9 min under emulation, longer when the host is busy)
  --parallel         run the legs at the same time (each leg's output is printed when it ends);
                     faster, but the legs compete for the CPUs, which timing checks feel
  COMMAND            what each leg runs, in the project checkout with OFFCPU_ATTACH set
                     (default: $OFFCPU_VENV/bin/python -m pytest -m kernel -v tests/e2e/test_probe.py
                     tests/e2e/test_probe_truth.py,
                     OFFCPU_VENV defaulting to the checkout's .venv)
EOF
}

log() { printf 'matrix.sh: %s\n' "$*" >&2; }
fail() { log "$*"; exit 2; }

here=$(cd "$(dirname "$0")" && pwd)
project=$(cd "$here/../.." && pwd)
legs=host,kprobe,tracepoint
kernel=""
timeout_s=900
parallel=0

while [ $# -gt 0 ]; do
	case "$1" in
	--legs) [ $# -ge 2 ] || fail "--legs needs a value"; legs=$2; shift 2 ;;
	--kernel) [ $# -ge 2 ] || fail "--kernel needs a value"; kernel=$2; shift 2 ;;
	--timeout) [ $# -ge 2 ] || fail "--timeout needs a value"; timeout_s=$2; shift 2 ;;
	--parallel) parallel=1; shift ;;
	-h | --help) usage; exit 0 ;;
	--) shift; break ;;
	*) usage >&2; fail "unexpected argument: $1 (the command goes after --)" ;;
	esac
done
IFS=, read -r -a leg_list <<<"$legs"
[ ${#leg_list[@]} -gt 0 ] || fail "--legs is empty"
for leg in "${leg_list[@]}"; do
	case "$leg" in host | kprobe | tracepoint) ;; *) fail "unknown leg '$leg' (host, kprobe, tracepoint)" ;; esac
done
if [ $# -gt 0 ]; then
	command=("$@")
else
	venv=${OFFCPU_VENV:-$project/.venv}
	[ -x "$venv/bin/python" ] || fail "no $venv/bin/python: run scripts/setup --test or set OFFCPU_VENV"
	# The probe tests: what depends on the kernel and the attach mode. The output tests in tests/e2e
	# do not, and under emulation all of them would take ~15 min per guest leg.
	command=("$venv/bin/python" -m pytest -m kernel -v tests/e2e/test_probe.py tests/e2e/test_probe_truth.py)
fi

guest_kernel=""
if [[ ",$legs," == *,kprobe,* || ",$legs," == *,tracepoint,* ]]; then
	guest_kernel=$("$here/run.sh" ${kernel:+--kernel "$kernel"} --print-kernel) \
		|| fail "cannot resolve the guest kernel"
fi

leg_name() {
	if [ "$1" = host ]; then
		echo "kernel $(uname -r) / tracepoint"
	else
		echo "kernel $guest_kernel / $1"
	fi
}

# run_leg LEG: runs one leg, leaves its exit status and duration in $work/LEG.rc and LEG.seconds.
run_leg() {
	local leg=$1 start end rc=0
	start=$(date +%s.%N)
	if [ "$leg" = host ]; then
		(cd "$project" && OFFCPU_ATTACH=tracepoint "${command[@]}") || rc=$?
	else
		"$here/run.sh" --kernel "$guest_kernel" --attach "$leg" --timeout "$timeout_s" -- "${command[@]}" || rc=$?
	fi
	end=$(date +%s.%N)
	echo "$rc" >"$work/$leg.rc"
	awk -v a="$start" -v b="$end" 'BEGIN { printf "%.0f\n", b - a }' >"$work/$leg.seconds"
}

work=$(mktemp -d /tmp/offcpu-matrix.XXXXXX)
pids=()
cleanup() {
	local p
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ $parallel -eq 0 ]; then
	for leg in "${leg_list[@]}"; do
		printf '\n=== %s: %s\n' "$(leg_name "$leg")" "${command[*]}"
		run_leg "$leg"
	done
else
	for leg in "${leg_list[@]}"; do
		run_leg "$leg" >"$work/$leg.log" 2>&1 &
		pids+=($!)
	done
	for i in "${!leg_list[@]}"; do
		wait "${pids[$i]}" || true
		printf '\n=== %s: %s\n' "$(leg_name "${leg_list[$i]}")" "${command[*]}"
		cat "$work/${leg_list[$i]}.log"
	done
	pids=()
fi

failed=0
printf '\n'
for leg in "${leg_list[@]}"; do
	rc=$(cat "$work/$leg.rc" 2>/dev/null || echo 1)
	seconds=$(cat "$work/$leg.seconds" 2>/dev/null || echo 0)
	if [ "$rc" = 0 ]; then
		echo "$(leg_name "$leg"): passed ($seconds s)"
	else
		echo "$(leg_name "$leg"): FAILED ($seconds s)"
		failed=1
	fi
done
exit $failed
