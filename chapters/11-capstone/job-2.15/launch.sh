#!/usr/bin/env bash
# Launch the MoE pre-training job on one node, one rank per GPU (upgraded to torch 2.15).
#   ./launch.sh --steps 2000 --ckpt-every 200        # arguments go to train.py
set -euo pipefail
cd "$(dirname "$0")"

NPROC=${NPROC:-8}                 # ranks on this node (one per GPU)
FR_DIR=${FR_DIR:-/tmp/fr}         # where a hang's flight-recorder dumps go
mkdir -p "$FR_DIR"

# Flight recorder: a long history per rank, and a dump from every rank whose collective times out.
# 2.15 reads the TORCH_FR_* names; the legacy names stay while a job may roll back to nccl-legacy, whose
# ProcessGroupNCCL reads only them (chapter 2, "The settings").
export TORCH_FR_BUFFER_SIZE=20000
export TORCH_FR_DUMP_ON_TIMEOUT=1
export TORCH_FR_DUMP_TEMP_FILE="$FR_DIR/rank_"
export TORCH_NCCL_TRACE_BUFFER_SIZE=20000
export TORCH_NCCL_DUMP_ON_TIMEOUT=1
export TORCH_NCCL_DEBUG_INFO_TEMP_FILE="$FR_DIR/rank_"
export OMP_NUM_THREADS=4

# A step stuck for 5 minutes makes every rank dump, the one stuck in compute too (train.py --hang-dump-after).
exec torchrun --standalone --nproc-per-node "$NPROC" train.py --backend nccl --probe-every 100 \
    --hang-dump-after 300 "$@"
