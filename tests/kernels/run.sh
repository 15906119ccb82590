#!/usr/bin/env bash
# Runs a command as root inside a stock Debian kernel booted under QEMU, with this machine's root
# filesystem shared read-only over 9p (same paths, same tools, same virtualenv) and the guest
# kernel's matching headers (or, with --headers, another kernel's) where bcc looks for them. Prints the command's output and exits with
# its exit status. See docs/kernel-matrix.md.
set -euo pipefail

usage() {
	cat <<'EOF'
usage: tests/kernels/run.sh [--kernel VERSION] [--headers VERSION] [--attach MODE]
                           [--timeout SECONDS] -- COMMAND...
       tests/kernels/run.sh [--kernel VERSION] --print-kernel

  --kernel VERSION   Debian kernel to boot: an exact ABI (6.1.0-57-amd64, 6.12.118+deb12-amd64,
                     6.12.118+deb12-rt-amd64) or a line resolved now from its metapackage:
                       6.1      linux-image-amd64 (the default)
                       6.12     linux-image-6.12-amd64
                       6.12-rt  linux-image-6.12-rt-amd64
  --headers VERSION  put this kernel's headers (same forms as --kernel) where bcc looks for them in
                     the guest instead of the booted kernel's own: headers that do not match
  --attach MODE      kprobe | tracepoint | auto: exported to COMMAND as OFFCPU_ATTACH (default auto)
  --timeout SECONDS  kill the guest and fail after this long (default 900)
  --print-kernel     print the kernel ABI that would be booted (or with --headers, whose
                     headers would be used), and exit

The command runs as root with the project checkout as working directory (read-only), HOME and
/tmp on tmpfs. Environment passed in: OFFCPU_*, PYTHONPATH, PYTEST_ADDOPTS (plus
"-p no:cacheprovider"), PYTHONDONTWRITEBYTECODE=1, PYTHONUNBUFFERED=1,
OFFCPU_GUEST_KERNEL=<booted ABI>, OFFCPU_GUEST_HEADERS=<headers' ABI>.
Kernel packages are cached in $OFFCPU_KERNEL_CACHE (default /var/cache/offcpu-kernels).
EOF
}

log() { printf 'run.sh: %s\n' "$*" >&2; }
fail() { log "$*"; exit 2; }

here=$(cd "$(dirname "$0")" && pwd)
project=$(cd "$here/../.." && pwd)
cache=${OFFCPU_KERNEL_CACHE:-/var/cache/offcpu-kernels}
kernel=""
headers=""
attach=auto
timeout_s=900
print_kernel=0

while [ $# -gt 0 ]; do
	case "$1" in
	--kernel) [ $# -ge 2 ] || fail "--kernel needs a value"; kernel=$2; shift 2 ;;
	--headers) [ $# -ge 2 ] || fail "--headers needs a value"; headers=$2; shift 2 ;;
	--attach) [ $# -ge 2 ] || fail "--attach needs a value"; attach=$2; shift 2 ;;
	--timeout) [ $# -ge 2 ] || fail "--timeout needs a value"; timeout_s=$2; shift 2 ;;
	--print-kernel) print_kernel=1; shift ;;
	-h | --help) usage; exit 0 ;;
	--) shift; break ;;
	*) usage >&2; fail "unexpected argument: $1 (the command goes after --)" ;;
	esac
done
[ $# -gt 0 ] || [ $print_kernel -eq 1 ] || { usage >&2; fail "no command given"; }
case "$attach" in kprobe | tracepoint | auto) ;; *) fail "--attach must be kprobe, tracepoint or auto, not '$attach'" ;; esac
[[ "$timeout_s" =~ ^[1-9][0-9]*$ ]] || fail "--timeout must be a positive number of seconds, not '$timeout_s'"
[ "$(id -u)" -eq 0 ] || fail "must run as root (installs packages, writes $cache)"
# The guest mounts fresh file systems on these: a checkout under /tmp or /var/tmp is shared on its
# own and mounted back over the guest's tmpfs; under the others it cannot be.
project_share=()
project_arg=""
case "$project/" in
/run/* | /dev/* | /proc/* | /sys/*)
	fail "the project checkout ($project) must not live under /run, /dev, /proc or /sys" ;;
/tmp/* | /var/tmp/*)
	project_share=(-virtfs "local,path=$project,mount_tag=project,security_model=none,readonly=on,multidevs=remap")
	project_arg=" offcpu.project=$project" ;;
esac

# --- host tools ------------------------------------------------------------------------------
export DEBIAN_FRONTEND=noninteractive
apt_updated=0
apt_update() {
	[ $apt_updated -eq 1 ] && return 0
	log "apt-get update"
	apt-get update -q >/dev/null
	apt_updated=1
}
need=()
for p in qemu-system-x86 busybox-static kmod cpio xz-utils zstd util-linux; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
	apt_update
	log "installing ${need[*]}"
	apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi

# --- kernel version --------------------------------------------------------------------------
# Debian removes superseded ABIs from the mirror: a kernel line is resolved from its metapackage
# each time, never pinned.
metapackage() {
	case "$1" in
	6.1) echo linux-image-amd64 ;;
	6.12) echo linux-image-6.12-amd64 ;;
	6.12-rt) echo linux-image-6.12-rt-amd64 ;;
	*) return 1 ;;
	esac
}
image_dep() {
	apt-cache show --no-all-versions "$1" 2>/dev/null \
		| sed -n 's/^Depends: .*linux-image-\([0-9][^ ,]*-amd64\).*/\1/p' | head -n1
}
# resolve VERSION: prints the ABI of a kernel line (6.1, 6.12, 6.12-rt) or checks an exact one.
resolve() {
	local v=$1 meta abi
	if meta=$(metapackage "$v"); then
		abi=$(image_dep "$meta")
		if [ -z "$abi" ]; then
			apt_update
			abi=$(image_dep "$meta")
		fi
		[ -n "$abi" ] || fail "cannot resolve the kernel version from the $meta metapackage"
		v=$abi
	fi
	case "$v" in *-amd64) ;; *) v=$v-amd64 ;; esac
	[[ "$v" =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9]+|\+deb[0-9]+)(-rt)?-amd64$ ]] \
		|| fail "not a Debian kernel ABI: '$1' (e.g. 6.1.0-57-amd64, 6.12.118+deb12-rt-amd64, or 6.1, 6.12, 6.12-rt)"
	echo "$v"
}
kernel=$(resolve "${kernel:-6.1}")
[ -z "$headers" ] || headers=$(resolve "$headers")
if [ $print_kernel -eq 1 ]; then
	echo "${headers:-$kernel}"
	exit 0
fi

# --- kernel image, modules and headers, cached ----------------------------------------------
# fetch VERSION: the image and headers packages of VERSION unpacked into $cache/VERSION/root.
fetch() {
	local ver=$1 pkgs dl f deps
	pkgs=("linux-image-$ver" "linux-headers-$ver")
	# linux-headers-<ver> depends on linux-headers-<...>-common (-common-rt for the RT build) and
	# on linux-kbuild-<...>.
	deps=$(apt-cache show --no-all-versions "linux-headers-$ver" 2>/dev/null | sed -n 's/^Depends: //p' || true)
	if [ -z "$deps" ]; then
		apt_update
		deps=$(apt-cache show --no-all-versions "linux-headers-$ver" 2>/dev/null | sed -n 's/^Depends: //p' || true)
	fi
	[ -n "$deps" ] || fail "no package linux-headers-$ver on the mirror (superseded ABI? try a kernel line: 6.1, 6.12, 6.12-rt)"
	mapfile -t -O ${#pkgs[@]} pkgs < <(printf '%s\n' "$deps" | tr ',' '\n' \
		| sed -n 's/^ *\(linux-headers-[^ ]*-common\(-rt\)\{0,1\}\|linux-kbuild-[^ ]*\)\( .*\)\{0,1\}$/\1/p')
	dl=$(mktemp -d "$cache/.download.XXXXXX")
	log "fetching ${pkgs[*]}"
	if ! (cd "$dl" && apt-get download -q "${pkgs[@]}" >/dev/null 2>"$dl/apt.log"); then
		cat "$dl/apt.log" >&2
		rm -rf "$dl"
		fail "apt-get download failed"
	fi
	mkdir "$dl/root"
	for f in "$dl"/*.deb; do dpkg-deb -x "$f" "$dl/root"; done
	[ -f "$dl/root/boot/vmlinuz-$ver" ] || fail "no /boot/vmlinuz-$ver in linux-image-$ver"
	# The package leaves modules.dep to its postinst.
	depmod -b "$dl/root" "$ver"
	rm -f "$dl"/*.deb "$dl/apt.log"
	chmod 0755 "$dl"
	rm -rf "${cache:?}/$ver"
	mv "$dl" "$cache/$ver"
}
fetched() {
	[ -f "$cache/$1/root/boot/vmlinuz-$1" ] && [ -f "$cache/$1/root/lib/modules/$1/modules.dep" ] \
		&& [ -d "$cache/$1/root/usr/src/linux-headers-$1" ]
}
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
fetched "$kernel" || fetch "$kernel"
headers=${headers:-$kernel}
fetched "$headers" || fetch "$headers"
flock -u 9
xroot=$cache/$kernel/root
# bcc's /lib/modules/<ver>/build and source: the arch-specific headers and the -common ones.
build=$cache/$headers/root/usr/src/linux-headers-$headers
source=$(find "$cache/$headers/root/usr/src" -mindepth 1 -maxdepth 1 -name 'linux-headers-*-common*')
if [ -z "$source" ] || [ "$(printf '%s\n' "$source" | wc -l)" -ne 1 ]; then
	fail "expected one linux-headers-*-common* directory in $cache/$headers/root/usr/src"
fi

# --- initramfs -------------------------------------------------------------------------------
tmp=$(mktemp -d /tmp/offcpu-kernel.XXXXXX)
qemu_pid=""
tail_pid=""
cleanup() {
	[ -n "$qemu_pid" ] && kill -KILL "$qemu_pid" 2>/dev/null
	[ -n "$tail_pid" ] && kill "$tail_pid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$tmp/initramfs/bin" "$tmp/initramfs/modules" "$tmp/initramfs/proc" "$tmp/initramfs/sys" \
	"$tmp/initramfs/dev" "$tmp/share"
cp /bin/busybox "$tmp/initramfs/bin/busybox"
install -m 0755 "$here/guest-init" "$tmp/initramfs/init"
: >"$tmp/initramfs/modules/order"
modprobe -S "$kernel" -d "$xroot" -a --show-depends virtio_pci 9pnet_virtio 9p \
	| awk '$1 == "insmod" && !seen[$2]++ { print $2 }' >"$tmp/modules.list"
[ -s "$tmp/modules.list" ] || fail "modprobe found no modules for virtio_pci 9pnet_virtio 9p in $xroot"
while read -r ko; do
	name=${ko##*/}
	# busybox insmod takes plain ELF modules only.
	case "$name" in
	*.ko.xz) xz -dc "$ko" >"$tmp/initramfs/modules/${name%.xz}"; name=${name%.xz} ;;
	*.ko.zst) zstd -qdc "$ko" >"$tmp/initramfs/modules/${name%.zst}"; name=${name%.zst} ;;
	*.ko.gz) gzip -dc "$ko" >"$tmp/initramfs/modules/${name%.gz}"; name=${name%.gz} ;;
	*) cp "$ko" "$tmp/initramfs/modules/$name" ;;
	esac
	echo "$name" >>"$tmp/initramfs/modules/order"
done <"$tmp/modules.list"
(cd "$tmp/initramfs" && find . | cpio -o -H newc --quiet | gzip -1) >"$tmp/initrd.gz"

# --- the job the guest runs ------------------------------------------------------------------
quote() {
	local a out=""
	for a in "$@"; do out+="'${a//\'/\'\\\'\'}' "; done
	printf '%s' "$out"
}
env_lines=""
while IFS= read -r name; do
	case "$name" in OFFCPU_ATTACH | OFFCPU_GUEST_KERNEL | OFFCPU_GUEST_HEADERS | OFFCPU_KERNEL_CACHE) continue ;; esac
	env_lines+="export $name=$(quote "${!name}")"$'\n'
done < <(compgen -e | grep -E '^(OFFCPU_[A-Z0-9_]+|PYTHONPATH)$' || true)
cat >"$tmp/share/job" <<EOF
# Written by tests/kernels/run.sh; runs as PID 1 in the guest after switch_root.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/tmp LANG=C.UTF-8 TERM=dumb
export PYTHONDONTWRITEBYTECODE=1
# Unbuffered: the output streams to the host as it is written, and a command that hangs at exit
# (a stuck thread) or is killed at the timeout still leaves everything it printed.
export PYTHONUNBUFFERED=1
export PYTEST_ADDOPTS=$(quote "-p no:cacheprovider ${PYTEST_ADDOPTS:-}")
export OFFCPU_ATTACH=$(quote "$attach")
export OFFCPU_GUEST_KERNEL=\$(uname -r)
export OFFCPU_GUEST_HEADERS=$(quote "$headers")
${env_lines}cut -d' ' -f1 /proc/uptime >/run/offcpu/started
cd $(quote "$project") && $(quote "$@") </dev/null >/run/offcpu/output 2>&1
echo \$? >/run/offcpu/status
cut -d' ' -f1 /proc/uptime >/run/offcpu/finished
sync
busybox poweroff -f
echo o >/proc/sysrq-trigger
EOF
: >"$tmp/share/output"

# --- boot ------------------------------------------------------------------------------------
log "booting $kernel (attach=$attach, headers $headers, timeout ${timeout_s} s)"
t0=$(date +%s.%N)
# No KVM for the guest: nested virtualisation does not work on this machine kind (a KVM guest
# hangs after the BIOS), so QEMU emulates the CPU (TCG, ~25x slower). --pdeathsig: the VM must
# not outlive this script when it is killed without a chance to clean up (SIGKILL).
setpriv --pdeathsig KILL qemu-system-x86_64 -accel tcg -cpu max -m 2G -smp 2 -nographic -no-reboot -nic none \
	-kernel "$xroot/boot/vmlinuz-$kernel" -initrd "$tmp/initrd.gz" \
	-append "console=ttyS0 panic=-1 quiet offcpu.modules=$xroot offcpu.build=$build offcpu.source=$source$project_arg" \
	-virtfs "local,path=/,mount_tag=rootfs,security_model=none,readonly=on,multidevs=remap" \
	-virtfs "local,path=$tmp/share,mount_tag=results,security_model=none,multidevs=remap" \
	"${project_share[@]}" \
	</dev/null >"$tmp/console.log" 2>&1 &
qemu_pid=$!
tail -n +1 -f --pid="$qemu_pid" "$tmp/share/output" &
tail_pid=$!

deadline=$(( $(date +%s) + timeout_s ))
while kill -0 "$qemu_pid" 2>/dev/null; do
	if [ "$(date +%s)" -ge "$deadline" ]; then
		kill -KILL "$qemu_pid" 2>/dev/null || true
		wait "$qemu_pid" 2>/dev/null || true
		qemu_pid=""
		wait "$tail_pid" 2>/dev/null || true
		tail_pid=""
		log "last console lines:"
		tail -n 20 "$tmp/console.log" >&2
		log "guest did not finish within ${timeout_s} s"
		exit 124
	fi
	sleep 0.5
done
qemu_rc=0
wait "$qemu_pid" || qemu_rc=$?
qemu_pid=""
wait "$tail_pid" 2>/dev/null || true
tail_pid=""
t1=$(date +%s.%N)

if [ ! -s "$tmp/share/status" ]; then
	log "console:"
	tail -n 40 "$tmp/console.log" >&2
	if grep -q "Kernel panic" "$tmp/console.log"; then
		# Exit status 125: the guest's kernel died under the emulator, no test failed (seen once in
		# many 6.12-rt runs on a loaded host: "Oops: int3" in __schedule as tracing was switched
		# on, likely a jump label's breakpoint met after its patching finished). matrix.sh reruns it.
		log "the guest kernel panicked (qemu exit status $qemu_rc)"
		exit 125
	fi
	fail "the guest powered off without reporting an exit status (qemu exit status $qemu_rc)"
fi
status=$(cat "$tmp/share/status")
boot=$(cat "$tmp/share/started")
end=$(cat "$tmp/share/finished" 2>/dev/null || echo "$boot")
awk -v k="$kernel" -v h="$headers" -v a="$attach" -v b="$boot" -v e="$end" -v t0="$t0" -v t1="$t1" -v s="$status" \
	'BEGIN { printf "run.sh: kernel %s, headers %s, attach %s: boot %.1f s, command %.1f s, total %.1f s, exit %s\n", k, h, a, b, e - b, t1 - t0, s }' >&2
[[ "$status" =~ ^[0-9]+$ ]] || fail "unreadable exit status from the guest: '$status'"
exit "$status"
