#!/usr/bin/env bash
# A rehearsal of the cluster layout on one machine: an engine tier of 2 `molrl serve` servers, a sandbox tier of 2
# `molrl sandbox serve` servers, and 2 trainer processes (`accelerate launch`, CPU processes over gloo) that sample on
# the engines with engine=vllm_server and run their rewards' code on the sandboxes with sandbox.backend=remote, for 2
# RL steps, all on localhost. It starts the servers, waits until each says ready, runs the trainers, stops the
# servers, and exits non-zero on any failure (a server that dies before it is ready, a trainer that fails, a run with
# no adapter).
#
#   scripts/cluster_local.sh                     # runs/smollm2/model, configs/rl_tiny.yaml, into runs/cluster_local
#   MODEL=path/to/model OUT=runs/x STEPS=2 scripts/cluster_local.sh
#
# The server and trainer commands are the ones examples/cluster/slurm.sbatch and examples/cluster/skypilot.yaml run
# on a cluster (tests/test_cluster_recipes.py checks that they stay the same); only the launcher around them differs.
# Settings (environment): MODEL, CONFIG, OUT, STEPS, PORTS (one per server), RANK (--max-lora-rank), MEMORY (each
# server's share of the machine's memory on a CPU: keep it small when two share one machine), HOST, READY_S,
# SANDBOX_PORTS (one per sandbox server), SANDBOX_WORKERS (each sandbox server's slots).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d .venv/bin ] && PATH="$PWD/.venv/bin:$PATH"

MODEL=${MODEL:-runs/smollm2/model}
CONFIG=${CONFIG:-configs/rl_tiny.yaml}
OUT=${OUT:-runs/cluster_local}
STEPS=${STEPS:-2}
PORTS=(${PORTS:-8001 8002})
RANK=${RANK:-16}
MEMORY=${MEMORY:-0.1}
HOST=${HOST:-127.0.0.1}
READY_S=${READY_S:-1800}
SANDBOX_PORTS=(${SANDBOX_PORTS:-8301 8302})
SANDBOX_WORKERS=${SANDBOX_WORKERS:-2}
SYNC_DIR=$OUT/engine_sync
ACCELERATE_CONFIG=configs/accelerate/cpu_2proc.yaml
TRAINERS=2 MACHINES=1 MACHINE_RANK=0 MAIN_NODE=127.0.0.1
MAIN_PORT=${MAIN_PORT:-29512}

[ -e "$MODEL/config.json" ] || { echo "cluster_local: no model at $MODEL (set MODEL=path/to/model)" >&2; exit 2; }
mkdir -p "$OUT/logs"
PIDS=()

stop_servers() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$pid" 2>/dev/null || true  # the server's whole group, should it not have stopped
  done
}
trap stop_servers EXIT

# --- the engine tier: one server per port, each in a process group of its own and, on a CPU, bound to a core of its
# own (vLLM's CPU backend otherwise binds every server on a machine to the same core) ---
SERVERS=""
CORES=$(nproc)
for i in "${!PORTS[@]}"; do
  PORT=${PORTS[$i]} BIND=${VLLM_CPU_OMP_THREADS_BIND:-$((i % CORES))}
  VLLM_CPU_OMP_THREADS_BIND=$BIND setsid molrl serve --model "$MODEL" --port "$PORT" --host "$HOST" \
    --max-lora-rank "$RANK" --memory "$MEMORY" \
    > "$OUT/logs/server_$PORT.log" 2>&1 &
  PIDS+=("$!")
  SERVERS="${SERVERS:+$SERVERS,}http://$HOST:$PORT"
done
echo "cluster_local: servers [$SERVERS] starting (logs in $OUT/logs)"
for i in "${!PORTS[@]}"; do
  log="$OUT/logs/server_${PORTS[$i]}.log"
  for ((waited = 0; ; waited++)); do
    grep -qs " ready$" "$log" && break
    if ! kill -0 "${PIDS[$i]}" 2>/dev/null; then
      echo "cluster_local: server on port ${PORTS[$i]} exited before it was ready; see $log:" >&2
      tail -n 20 "$log" >&2
      exit 1
    fi
    if [ "$waited" -ge "$READY_S" ]; then
      echo "cluster_local: server on port ${PORTS[$i]} not ready in $READY_S s ($log)" >&2
      exit 1
    fi
    sleep 1
  done
done
echo "cluster_local: servers ready"

# --- the sandbox tier: one `molrl sandbox serve` per port, each with its own slots (on a cluster: CPU machines) ---
SANDBOXES=""
for SANDBOX_PORT in "${SANDBOX_PORTS[@]}"; do
  setsid molrl sandbox serve --port "$SANDBOX_PORT" --host "$HOST" --workers "$SANDBOX_WORKERS" \
    > "$OUT/logs/sandbox_$SANDBOX_PORT.log" 2>&1 &
  PIDS+=("$!")
  SANDBOXES="${SANDBOXES:+$SANDBOXES,}http://$HOST:$SANDBOX_PORT"
done
for SANDBOX_PORT in "${SANDBOX_PORTS[@]}"; do
  log="$OUT/logs/sandbox_$SANDBOX_PORT.log"
  for ((waited = 0; ; waited++)); do
    grep -q "sandbox server on http" "$log" && break
    if [ "$waited" -ge 120 ]; then
      echo "cluster_local: sandbox server on port $SANDBOX_PORT not serving in 120 s; see $log:" >&2
      tail -n 20 "$log" >&2
      exit 1
    fi
    sleep 1
  done
done
echo "cluster_local: sandbox servers [$SANDBOXES] serving"

# --- the trainers: $TRAINERS CPU processes over gloo on this machine (on a cluster: one launch per node) ---
export ACCELERATE_USE_CPU=true OMP_NUM_THREADS=1
accelerate launch --config_file "$ACCELERATE_CONFIG" --num_processes "$TRAINERS" --num_machines "$MACHINES" \
  --machine_rank "$MACHINE_RANK" --main_process_ip "$MAIN_NODE" --main_process_port "$MAIN_PORT" \
  -m molrl.cli rl --config "$CONFIG" model.path="$MODEL" output_dir="$OUT/run" train.max_steps="$STEPS" \
    engine=vllm_server "engine_servers=[$SERVERS]" engine_sync_dir="$SYNC_DIR" \
    sandbox.backend=remote "sandbox.servers=[$SANDBOXES]"

[ -e "$OUT/run/adapter/adapter_config.json" ] || { echo "cluster_local: the run saved no adapter" >&2; exit 1; }
echo "cluster_local: $STEPS steps on $TRAINERS trainers, ${#PORTS[@]} servers and ${#SANDBOX_PORTS[@]} sandbox servers done: $OUT/run"
