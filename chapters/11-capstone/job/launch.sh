#!/usr/bin/env bash
# Launch the MoE pre-training job on one node, one rank per GPU (written for torch 2.14).
#   ./launch.sh --steps 2000 --ckpt-every 200        # arguments go to train.py
set -euo pipefail
cd "$(dirname "$0")"

NPROC=${NPROC:-8}                 # ranks on this node (one per GPU)
FR_DIR=${FR_DIR:-/tmp/fr}         # where a hang's flight-recorder dumps go
mkdir -p "$FR_DIR"

# Flight recorder: a long history per rank, and a dump from every rank whose collective times out.
export TORCH_NCCL_TRACE_BUFFER_SIZE=20000
export TORCH_NCCL_DUMP_ON_TIMEOUT=1
export TORCH_NCCL_DEBUG_INFO_TEMP_FILE="$FR_DIR/rank_"
export OMP_NUM_THREADS=4

exec torchrun --standalone --nproc-per-node "$NPROC" train.py --backend nccl --probe-every 100 "$@"
