#!/usr/bin/env bash
# install-cuda.sh: install what a `-tags tandemcuda` build of Tandem needs on Debian
# bookworm: the CUDA 11.8 headers and libraries (cuda.h, cuBLAS, libcuda) from
# the contrib and non-free components of the Debian archive.
#
# Idempotent: the apt source file is written only when it is missing or
# different, and apt installs only packages that are not installed. Each step
# says what it did. Run as root (make check-cuda runs it when it is root and
# otherwise prints the command to run).
#
# The source file is a deb822 file of its own, so the system's own
# debian.sources is left alone; remove it with
#   rm /etc/apt/sources.list.d/tandem-cuda.sources && apt-get update
set -euo pipefail

SRC=/etc/apt/sources.list.d/tandem-cuda.sources
# nvidia-cuda-dev: cuda.h, cublas_v2.h, libcuda/libcublas for the linker
# (it pulls in libcuda1, the driver's user-space library).
PKGS=(nvidia-cuda-dev)

say() { printf 'install-cuda: %s\n' "$*"; }

if [ "$(id -u)" != 0 ]; then
	say "must run as root (it writes $SRC and runs apt-get): sudo $0" >&2
	exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
	say "apt-get not found: this script installs Debian's packages; install CUDA 11.8+ (cuda.h, libcuda, cuBLAS) by other means" >&2
	exit 1
fi
. /etc/os-release
codename=${VERSION_CODENAME:-}
if [ -z "$codename" ]; then
	say "cannot tell the Debian release from /etc/os-release" >&2
	exit 1
fi

want=$(cat <<SOURCES
# Written by Tandem's scripts/install-cuda.sh: Debian's contrib and non-free
# components, for nvidia-cuda-dev (a -tags tandemcuda build).
Types: deb
URIs: http://deb.debian.org/debian
Suites: $codename $codename-updates
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
)

update=0
if [ -f "$SRC" ] && [ "$(cat "$SRC")" = "$want" ]; then
	say "apt source $SRC already present"
else
	printf '%s\n' "$want" >"$SRC"
	say "wrote apt source $SRC (contrib non-free for $codename)"
	update=1
fi

missing=()
for p in "${PKGS[@]}"; do
	if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		say "$p already installed ($(dpkg-query -W -f='${Version}' "$p"))"
	else
		missing+=("$p")
	fi
done
if [ ${#missing[@]} -eq 0 ]; then
	say "nothing to install"
else
	if [ $update = 1 ] || ! apt-cache show "${missing[0]}" >/dev/null 2>&1; then
		say "apt-get update"
		apt-get update -qq
	fi
	say "installing ${missing[*]} (about 800 MB to download, 2.8 GB installed)"
	# nvidia's packages ask debconf questions about the kernel module; the
	# module is not needed to compile or link.
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
	for p in "${missing[@]}"; do
		say "installed $p $(dpkg-query -W -f='${Version}' "$p")"
	done
fi

if ! printf '#include <cuda.h>\n#include <cublas_v2.h>\n' | ${CC:-cc} -E -x c - >/dev/null 2>&1; then
	say "cuda.h or cublas_v2.h is still not on the C compiler's include path" >&2
	exit 1
fi
say "cuda.h and cublas_v2.h found; a -tags tandemcuda build can compile and link"
