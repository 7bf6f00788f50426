#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# run-in-guest.sh: runs a command inside a throw-away QEMU guest that has real
# RDMA: Debian's stock kernel with rdma_rxe (Soft-RoCE), driven by the host's
# own rdma-core (librdmacm/libibverbs) and the host's freshly built binaries.
#
#   tests/softroce/run-in-guest.sh [--] CMD [ARGS...]
#
# Exit status: CMD's; 125 when the guest failed or timed out before CMD ended.
#
# The guest:
#   - has no network device to the outside (-nic none): RDMA traffic stays on
#     a veth pair inside it;
#   - sees the host's / read-only over 9p with a tmpfs overlay (writes vanish
#     at power-off), and the current directory read-write at the same path;
#   - gets two Soft-RoCE devices: rxe0 on veth0 (ADDR1, 192.168.77.1) and rxe1
#     on veth1 (ADDR2, .2). Policy routing makes traffic between .1 and .2
#     really cross rxe1 -> veth -> rxe0; an rdma_cm client that does not bind
#     loops back inside the device that owns the destination.
#   - exports RDMABROKER_GUEST=1, RDMABROKER_GUEST_ADDR1/ADDR2 and
#     RDMABROKER_GUEST_DEVICES to CMD, plus PATH, LANG, CI, TERM, the guest
#     suite's settings (RDMABROKER_GUEST_FILTER, _JOBS, _JOBS_TSAN, _RUNS) and the
#     names in RDMABROKER_GUEST_PASS_ENV.
#
# Settings (environment):
#   RDMABROKER_GUEST_CACHE    kernel/initramfs cache   (/var/cache/rdmabroker-guest)
#   RDMABROKER_GUEST_TIMEOUT  kill the guest after N s (1800; 0 = never)
#   RDMABROKER_GUEST_MEM      guest memory, MiB        (2048)
#   RDMABROKER_GUEST_SMP      guest vCPUs              (host cores)
#   RDMABROKER_GUEST_ACCEL    auto | kvm | tcg         (auto: KVM only with a
#                             hardware kvm_intel/kvm_amd and no kvm_pvm)
#   RDMABROKER_GUEST_VERBOSE  1: boot output and timings
#   RDMABROKER_GUEST_KERNEL_ARGS  more guest kernel arguments (e.g. idle=poll)
#   RDMABROKER_GUEST_INIT     bash | systemd (bash: CMD runs under a minimal PID 1;
#                             systemd: the host's systemd boots as PID 1 into a
#                             target that runs CMD as a service, so CMD can
#                             drive real units with systemctl and journalctl)
#
# Why it is built this way (measured; see docs/testing.md):
#   - KVM on these machines is kvm_pvm, which cannot run a stock kernel, so the
#     guest runs under TCG; booting the extracted ELF vmlinux instead of the
#     xz bzImage saves ~4 s of emulated decompression.
#   - rxe on Linux 6.1 works only in the initial network namespace, hence one
#     namespace with policy routing instead of two namespaces.
#   - PID 1 in the guest must never exit (kernel panic) and must not exec from
#     the 9p root after power-off is requested.
set -euo pipefail

CACHE=${RDMABROKER_GUEST_CACHE:-/var/cache/rdmabroker-guest}
TIMEOUT=${RDMABROKER_GUEST_TIMEOUT:-1800}
MEM=${RDMABROKER_GUEST_MEM:-2048}
SMP=${RDMABROKER_GUEST_SMP:-$(nproc)}
ACCEL=${RDMABROKER_GUEST_ACCEL:-auto}
VERBOSE=${RDMABROKER_GUEST_VERBOSE:-0}
INIT=${RDMABROKER_GUEST_INIT:-bash}
SUBNET=192.168.77

log() { printf 'rdmabroker-guest: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 125; }

[ "${1:-}" = "--" ] && shift
[ $# -ge 1 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "must run as root (apt-get, 9p export of /)"

# ------------------------------------------------------------- host packages
HOST_PKGS=(qemu-system-x86 rdma-core ibverbs-utils ibverbs-providers rdmacm-utils
           iproute2 kmod cpio gzip xz-utils perl util-linux)
missing=()
for p in "${HOST_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
APT_UPDATED=0
apt_update_once() {
  [ "$APT_UPDATED" = 1 ] && return 0
  apt-get update -qq >&2 || die "apt-get update failed"
  APT_UPDATED=1
}
if [ ${#missing[@]} -gt 0 ]; then
  apt_update_once
  log "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 \
    || die "apt-get install failed"
fi

# ---------------------------------------- kernel and static busybox, cached
# Both are unpacked into the cache (dpkg -x), never installed on the host. A
# lock keeps concurrent runs from preparing the cache at the same time.
mkdir -p "$CACHE/dl"
exec 9>"$CACHE/.lock"
flock 9

unpack_deb() {  # $1 = package, $2 = target dir
  local pkg=$1 dir=$2
  rm -f "$CACHE"/dl/*.deb
  (cd "$CACHE/dl" && apt-get download -qq "$pkg" >/dev/null 2>&1) || die "apt-get download $pkg failed"
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
  dpkg -x "$CACHE"/dl/*.deb "$dir.tmp"
  rm -f "$CACHE"/dl/*.deb
}

trim_kernel() {  # $1 = unpacked linux-image dir: keep only what a guest needs
  local d=$1 kv m x off
  kv=$(ls "$d/lib/modules" | head -n1)
  m="$d/lib/modules/$kv/kernel"
  rm -rf "$m/sound"
  for x in "$m"/drivers/*; do
    case ${x##*/} in infiniband|net|virtio|char|block|nvdimm|dax|md) ;; *) rm -rf "$x" ;; esac
  done
  for x in "$m"/drivers/net/*/; do
    case $(basename "$x") in bonding|team|vxlan|ipvlan|netdevsim) ;; *) rm -rf "$x" ;; esac
  done
  depmod -b "$d" "$kv"
  # The uncompressed ELF kernel: QEMU boots it through its PVH note.
  off=$(grep -abo -m1 $'\xfd7zXZ' "$d/boot/vmlinuz-$kv" | head -n1 | cut -d: -f1) || true
  if [ -n "$off" ]; then
    # no pipefail: xz stops after its stream and tail gets SIGPIPE
    ( set +o pipefail; tail -c +$((off + 1)) "$d/boot/vmlinuz-$kv" | xz -dc --single-stream >"$d/boot/vmlinux-$kv" 2>/dev/null ) || true
  fi
  if [ "$(head -c4 "$d/boot/vmlinux-$kv" 2>/dev/null | od -An -c | tr -d ' ')" != "177ELF" ]; then
    rm -f "$d/boot/vmlinux-$kv"
  fi
}

if [ ! -e "$CACHE/kernel/.ok" ] || [ ! -e "$CACHE/busybox/.ok" ]; then
  apt_update_once  # old kernel ABI packages leave the mirror: use fresh lists
  kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  [ -n "$kpkg" ] || die "cannot resolve linux-image-amd64"
  log "preparing $kpkg (once per machine)"
  unpack_deb "$kpkg" "$CACHE/kernel"
  trim_kernel "$CACHE/kernel.tmp"
  unpack_deb busybox-static "$CACHE/busybox"
  for d in kernel busybox; do
    touch "$CACHE/$d.tmp/.ok"
    rm -rf "${CACHE:?}/$d"
    mv "$CACHE/$d.tmp" "$CACHE/$d"
  done
fi
KROOT="$CACHE/kernel"
KV=$(ls "$KROOT/lib/modules" | head -n1)
BOOTK="$KROOT/boot/vmlinux-$KV"
[ -s "$BOOTK" ] || BOOTK="$KROOT/boot/vmlinuz-$KV"
BUSYBOX="$CACHE/busybox/bin/busybox"
[ -x "$BUSYBOX" ] || die "cache incomplete: $BUSYBOX"

# ------------------------------------------------------ initramfs (stage 1)
# busybox mounts the host root over 9p, puts a tmpfs overlay on it, mounts the
# exchange directory and switches root to the host's bash running stage 2.
STAGE1=$(cat <<'EOF'
#!/bin/busybox sh
export PATH=/bin
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
fail() { echo "guest stage1: $*" >/dev/console; echo o >/proc/sysrq-trigger; sleep 10; }
for m in $(cat /modules.list); do insmod "/modules/$m" 2>/dev/null || true; done
mkdir -p /lower /rw /newroot
O9="trans=virtio,version=9p2000.L,msize=512000"
mount -t 9p -o "$O9,ro,cache=loose" hostroot /lower || fail "9p mount of the host root"
mount -t tmpfs -o mode=755 tmpfs /rw; mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot || fail "overlay"
mount -t tmpfs -o mode=755 tmpfs /newroot/run
mkdir -p /newroot/run/guest
mount -t 9p -o "$O9,cache=none" xchg /newroot/run/guest || fail "9p mount of xchg"
mount --move /proc /newroot/proc; mount --move /sys /newroot/sys; mount --move /dev /newroot/dev
exec switch_root /newroot /bin/bash /run/guest/stage2.sh
EOF
)
STAGE1_MODS="virtio_pci 9pnet_virtio 9p overlay"
IHASH=$( { echo "$STAGE1"; echo "$STAGE1_MODS"; echo "$KV"; sha256sum "$BUSYBOX"; } | sha256sum | cut -c1-16)
INITRD="$CACHE/initramfs-$IHASH.cpio.gz"
if [ ! -s "$INITRD" ]; then
  rm -f "$CACHE"/initramfs-*.cpio.gz
  w=$(mktemp -d)
  mkdir -p "$w"/{bin,dev,proc,sys,modules}
  cp "$BUSYBOX" "$w/bin/busybox"
  printf '%s\n' "$STAGE1" >"$w/init" && chmod 755 "$w/init"
  for m in $STAGE1_MODS; do
    modprobe -d "$KROOT" -S "$KV" --show-depends "$m" | awk '$1=="insmod"{print $2}'
  done | awk '!seen[$0]++' | while read -r ko; do cp "$ko" "$w/modules/"; basename "$ko"; done >"$w/modules.list"
  (cd "$w" && find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1) >"$INITRD.tmp"
  mv "$INITRD.tmp" "$INITRD"
  rm -rf "$w"
fi
flock -u 9
exec 9>&-

# ------------------------------------------------ per-run exchange directory
X=$(mktemp -d /tmp/rdmabroker-guest.XXXXXX)
cleanup() {
  [ -s "$X/qemu.pid" ] && kill "$(cat "$X/qemu.pid")" 2>/dev/null
  rm -rf "$X"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
CWD=$(pwd -P)
[ "$CWD" != / ] || die "run it from a project directory, not /"
printf 'G_KV=%q\nG_KROOT=%q\nG_CWD=%q\nG_SUBNET=%q\nG_VERBOSE=%q\nG_INIT=%q\nG_CWD_CACHE=%q\n' "$KV" "$(readlink -f "$KROOT")" "$CWD" "$SUBNET" "$VERBOSE" "$INIT" "${RDMABROKER_GUEST_CWD_CACHE:-loose}" >"$X/config"
{
  for v in PATH LANG LC_ALL CI TERM RDMABROKER_GUEST_FILTER RDMABROKER_GUEST_JOBS RDMABROKER_GUEST_JOBS_TSAN RDMABROKER_GUEST_RUNS ${RDMABROKER_GUEST_PASS_ENV:-}; do
    [ -n "${!v+x}" ] && printf 'export %s=%q\n' "$v" "${!v}"
  done
  printf 'cd -- %q || exit 126\n' "$CWD"
  printf 'exec'; printf ' %q' "$@"; printf '\n'
} >"$X/cmd.sh"

cat >"$X/stage2.sh" <<'EOF'
#!/bin/bash
# Stage 2, PID 1 in the guest, on the overlay of the host's root.
X=/run/guest
. $X/config
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
mkfifo /run/.off
off() { sync; echo o >/proc/sysrq-trigger; read -r -t 30 <>/run/.off; }
fail() { echo "guest stage2: $*"; echo 125 >$X/rc; off; }
mkdir -p /dev/pts /dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
ln -sfn /proc/self/fd /dev/fd
hostname rdmabroker-guest
ulimit -l unlimited; ulimit -n 65536
mkdir -p /lib/modules/$G_KV && mount --bind "$G_KROOT/lib/modules/$G_KV" /lib/modules/$G_KV
mkdir -p "$G_CWD"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=${G_CWD_CACHE:-mmap} cwd "$G_CWD" || fail "cwd mount"
ip link set lo up
modprobe -a rdma_rxe rdma_ucm ib_uverbs || fail "modprobe rdma_rxe"
A1=$G_SUBNET.1 A2=$G_SUBNET.2
# One ip/rdma batch each: every exec costs ~0.1 s under emulation.
ip -batch - <<EOT || fail "ip setup"
link add veth0 type veth peer name veth1
addr add $A1/24 dev veth0
addr add $A2/24 dev veth1
link set veth0 up
link set veth1 up
rule add pref 10 iif lo from $A1 to $A2 lookup 101
rule add pref 11 iif lo from $A2 to $A1 lookup 102
route add $A2 dev veth0 src $A1 table 101
route add $A1 dev veth1 src $A2 table 102
rule add pref 100 lookup local
rule del pref 0
EOT
for k in all default veth0 veth1; do echo 0 >/proc/sys/net/ipv4/conf/$k/rp_filter; done
for k in veth0 veth1; do echo 1 >/proc/sys/net/ipv4/conf/$k/accept_local; done
printf 'link add rxe0 type rxe netdev veth0\nlink add rxe1 type rxe netdev veth1\n' | rdma -b - || fail "rdma link add"
for d in rxe0 rxe1; do
  for ((i = 0; i < 100; i++)); do
    grep -q ACTIVE /sys/class/infiniband/$d/ports/1/state 2>/dev/null && break
    sleep 0.1
  done
done
export RDMABROKER_GUEST=1 RDMABROKER_GUEST_ADDR1=$A1 RDMABROKER_GUEST_ADDR2=$A2 RDMABROKER_GUEST_DEVICES="rxe0 rxe1"
[ "$G_VERBOSE" = 1 ] && { rdma link show; ip -br addr; }
if [ "$G_INIT" = systemd ]; then
  # systemd becomes PID 1 (this shell execs it) and boots only sysinit plus
  # one service that runs CMD, reports its status and powers off. The unit
  # files live in the tmpfs overlay: they vanish with the guest.
  {
    echo '#!/bin/bash'
    printf 'export RDMABROKER_GUEST=1 RDMABROKER_GUEST_ADDR1=%s RDMABROKER_GUEST_ADDR2=%s RDMABROKER_GUEST_DEVICES="rxe0 rxe1" RDMABROKER_GUEST_INIT=systemd\n' "$A1" "$A2"
    echo 'bash /run/guest/cmd.sh </dev/null >/dev/ttyS0 2>&1'
    echo 'rc=$?'
    echo 'echo "@@GUEST_END@@ rc=$rc uptime=$(cut -d" " -f1 /proc/uptime)" >/dev/ttyS0'
    echo 'echo $rc >/run/guest/rc; sync; echo o >/proc/sysrq-trigger'
  } >/etc/guest-cmd.sh
  chmod 755 /etc/guest-cmd.sh
  mkdir -p /etc/systemd/system /etc/systemd/system.conf.d
  printf '[Manager]\nShowStatus=no\n' >/etc/systemd/system.conf.d/guest.conf  # no progress spinner on the console
  printf '[Unit]\nDescription=rdmabroker guest run\nRequires=sysinit.target guest-cmd.service\nAfter=sysinit.target\nAllowIsolate=yes\n' \
    >/etc/systemd/system/guest.target
  printf '[Unit]\nAfter=sysinit.target systemd-journald.service\n[Service]\nType=oneshot\nLimitMEMLOCK=infinity\nExecStart=/etc/guest-cmd.sh\n' \
    >/etc/systemd/system/guest-cmd.service
  echo "@@GUEST_BEGIN@@ $(cut -d' ' -f1 /proc/uptime)"
  exec /lib/systemd/systemd --unit=guest.target --show-status=false --log-level=warning --log-target=kmsg
fi
echo "@@GUEST_BEGIN@@ $(cut -d' ' -f1 /proc/uptime)"
setsid bash $X/cmd.sh </dev/null >/dev/ttyS0 2>&1 &
wait $!
rc=$?
echo "@@GUEST_END@@ rc=$rc uptime=$(cut -d' ' -f1 /proc/uptime)"
echo $rc >$X/rc
off
EOF

# --------------------------------------------------------------------- boot
if [ "$ACCEL" = auto ]; then
  ACCEL=tcg
  if [ -w /dev/kvm ] && { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; } && [ ! -d /sys/module/kvm_pvm ]; then
    ACCEL=kvm
  fi
fi
if [ "$ACCEL" = kvm ]; then ACC=(-accel kvm -cpu host); else ACC=(-accel tcg,thread=multi -cpu max,la57=off); fi
QARGS=(qemu-system-x86_64 "${ACC[@]}" -machine pc -smp "$SMP" -m "$MEM"
  -nodefaults -no-user-config -nic none -display none -no-reboot
  -chardev stdio,id=con,signal=on -serial chardev:con -monitor none
  -bios /usr/share/qemu/qboot.rom -kernel "$BOOTK" -initrd "$INITRD"
  -append "console=ttyS0 loglevel=3 panic=-1 mitigations=off nokaslr tsc=reliable${RDMABROKER_GUEST_KERNEL_ARGS:+ $RDMABROKER_GUEST_KERNEL_ARGS}"
  -fsdev local,id=fs0,path=/,security_model=none,readonly=on,multidevs=remap
  -device virtio-9p-pci,fsdev=fs0,mount_tag=hostroot
  -fsdev local,id=fs1,path="$X",security_model=none
  -device virtio-9p-pci,fsdev=fs1,mount_tag=xchg
  -fsdev local,id=fs2,path="${CWD//,/,,}",security_model=none,multidevs=remap
  -device virtio-9p-pci,fsdev=fs2,mount_tag=cwd
  -pidfile "$X/qemu.pid")
[ "$TIMEOUT" != 0 ] && QARGS=(timeout -k 5 "$TIMEOUT" "${QARGS[@]}")
[ "$VERBOSE" = 1 ] && log "accel=$ACCEL smp=$SMP mem=${MEM}M kernel=$KV"

T1=$(date +%s.%N)
# Show CMD's output only (between the markers), CRs stripped; perl, not mawk,
# because mawk buffers its input.
{ "${QARGS[@]}" </dev/null 2>&1 | tee "$X/console.log" | V="$VERBOSE" T1="$T1" perl -MTime::HiRes=time -ne '
    BEGIN { $| = 1; $v = $ENV{V}; $t1 = $ENV{T1} }
    s/\r$//;
    if (/^\@\@GUEST_BEGIN\@\@ (\S+)/) { $on = 1; printf STDERR "rdmabroker-guest: ready %.1f s after qemu start\n", time - $t1; next }
    if (/^\@\@GUEST_END\@\@ (.*)/) { $on = 0; printf STDERR "rdmabroker-guest: command done %.1f s after qemu start (%s)\n", time - $t1, $1; next }
    print if $on || $v;'; } &
wait $! || true
rm -f "$X/qemu.pid"
if [ -s "$X/rc" ]; then
  exit "$(cat "$X/rc")"
fi
log "the guest ended without a result (crash or timeout after ${TIMEOUT}s); last console lines:"
tail -n 30 "$X/console.log" | tr -d '\r' >&2
exit 125
