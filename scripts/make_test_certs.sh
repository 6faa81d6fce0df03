#!/usr/bin/env bash
# Makes a test CA and a certificate per host for psrt's mutual TLS, with
# openssl, into a directory.
#
#   scripts/make_test_certs.sh --out DIR [--cluster_spec FILE] [--token] [HOST...]
#
# DIR/ca.crt, DIR/ca.key: the CA (reused when DIR already has one, so hosts
# can be added later). DIR/HOST.crt, DIR/HOST.key: one certificate per host,
# for every host of --cluster_spec and every HOST given, valid for 365 days
# as server and client, naming the host as a SAN (an IP address or a DNS
# name). Every loopback host (127.0.0.1, localhost, ::1) shares one
# certificate, DIR/localhost.crt, naming all three. --token also writes a
# random auth token to DIR/token (kept if there is one). Keys and the token
# are mode 0600.
#
# Every task on a host uses its host's files:
#   --tls_cert=DIR/HOST.crt --tls_key=DIR/HOST.key --tls_ca=DIR/ca.crt
#   [--auth_token_file=DIR/token]
# Only ca.crt, the host's own .crt/.key and the token go to each machine;
# ca.key stays where certificates are made.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${PSRT_BIN_DIR:-$root/build/bin}"

usage() { sed -n '2,20p' "$0" >&2; exit 2; }
out="" spec="" token=0
hosts=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="${2:-}"; shift 2 ;;
    --out=*) out="${1#*=}"; shift ;;
    --cluster_spec) spec="${2:-}"; shift 2 ;;
    --cluster_spec=*) spec="${1#*=}"; shift ;;
    --token) token=1; shift ;;
    -h|--help) usage ;;
    -*) echo "make_test_certs.sh: unknown argument $1" >&2; exit 2 ;;
    *) hosts+=("$1"); shift ;;
  esac
done
[ -n "$out" ] || { echo "make_test_certs.sh: --out DIR is required" >&2; usage; }
command -v openssl >/dev/null || { echo "make_test_certs.sh: needs openssl (scripts/setup.sh installs it)" >&2; exit 2; }
if [ -n "$spec" ]; then
  tasks="$("$bin/psrtctl" tasks --cluster_spec="$spec")" || exit 2
  while read -r _ _ address; do
    host="${address%:*}"; host="${host#[}"; host="${host%]}"
    hosts+=("$host")
  done <<<"$tasks"
fi
[ ${#hosts[@]} -gt 0 ] || { echo "make_test_certs.sh: no hosts: give --cluster_spec FILE or HOST..." >&2; exit 2; }

# Runs a command quietly; shows its output when it fails.
quiet() {
  local log
  if ! log="$("$@" 2>&1)"; then echo "$log" >&2; echo "make_test_certs.sh: $1 failed" >&2; exit 1; fi
}

umask 077
mkdir -p "$out"
ec_key=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)

if [ ! -f "$out/ca.crt" ] || [ ! -f "$out/ca.key" ]; then
  quiet openssl req -x509 "${ec_key[@]}" -keyout "$out/ca.key" -out "$out/ca.crt" \
    -days 365 -subj "/CN=psrt test CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign"
  chmod 644 "$out/ca.crt"
  echo "make_test_certs: made the CA $out/ca.crt"
fi

is_ip() { [[ "$1" =~ ^[0-9]+(\.[0-9]+){3}$ ]] || [[ "$1" == *:* ]]; }

declare -A done_hosts
for host in "${hosts[@]}"; do
  case "$host" in
    127.0.0.1|localhost|::1) name=localhost san="IP:127.0.0.1,IP:::1,DNS:localhost" ;;
    *) name="${host//:/_}"
       if is_ip "$host"; then san="IP:$host"; else san="DNS:$host"; fi ;;
  esac
  [ -z "${done_hosts[$name]:-}" ] || continue
  done_hosts[$name]=1
  quiet openssl req -new "${ec_key[@]}" -keyout "$out/$name.key" -out "$out/$name.csr" \
    -subj "/CN=$host"
  quiet openssl x509 -req -in "$out/$name.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days 365 -out "$out/$name.crt" \
    -extfile <(printf '%s\n' "subjectAltName=$san" "basicConstraints=CA:FALSE" \
                 "keyUsage=critical,digitalSignature,keyEncipherment" \
                 "extendedKeyUsage=serverAuth,clientAuth")
  rm -f "$out/$name.csr"
  chmod 644 "$out/$name.crt"
  echo "make_test_certs: $host: --tls_cert=$out/$name.crt --tls_key=$out/$name.key --tls_ca=$out/ca.crt"
done

if [ $token -eq 1 ]; then
  if [ -f "$out/token" ]; then
    echo "make_test_certs: kept the auth token in $out/token"
  else
    openssl rand -hex 32 >"$out/token"
    echo "make_test_certs: auth token in $out/token: --auth_token_file=$out/token"
  fi
fi
