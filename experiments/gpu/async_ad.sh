# Issues 4, 7 and 8 on a 4-GPU machine, in one call (every phase has a hard time limit):
#   GPUs 0-1  asynchronous DQN (Breakout-MinAtar): `--mode both` on both GPUs; a learner on GPU 0
#             with a collector on GPU 1; then the same learner with collectors on GPUs 1 and 3
#   GPU 2     Algorithm Distillation at full size: 2048 learning histories, the darkroom-ad
#             preset (d128, 4 layers) in bf16, in-context evaluation, input-pipeline throughput
#   GPU 3     the transformer training-step table (MFU), then the second collector
# Run from the repo root:  bash experiments/gpu/run.sh async_ad
# PHASES="ad" GPU_AD=0 AD_ARGS="--num-updates 40000" T_AD=420 AD_THROUGHPUT=0: AD alone on
# a one-GPU machine, longer, without the throughput measurement.
# DRY=1 runs the same commands at toy sizes on a CPU machine (GPU pinning off).
source experiments/gpu/setup.sh
set -o pipefail
T_ASYNC=${T_ASYNC:-60}; T_HIST=240; T_AD=${T_AD:-240}
SIZE_ASYNC=""; SIZE_AD="--precision bf16 ${AD_ARGS:-}"; TASKS=2048; EPISODES=${EPISODES:-200}
STEP_ARGS="--repeats 10"; AD_STEP="--batch 4096"; D512="--d-model 512 --n-layers 6 --n-heads 8 --context-len 256 --batch 256"
if [ "${DRY:-0}" = 1 ]; then
  T_ASYNC=25; T_HIST=60; T_AD=90; TASKS=16; EPISODES=4
  SIZE_ASYNC="--total-timesteps 409600 --learning-starts 2048 --buffer-size 16384 --log-every 5 --checkpoint-every 5"
  SIZE_AD="--ad-batch-size 8 --num-updates 40 --log-every 10 --checkpoint-every 20 --d-model 32 --n-layers 1 --n-heads 2"
  STEP_ARGS="--repeats 2"; AD_STEP="--batch 8"; D512="--d-model 32 --n-layers 1 --n-heads 2 --context-len 16 --batch 4"
fi
gpu() { if [ "${DRY:-0}" = 1 ]; then env -u CUDA_VISIBLE_DEVICES "${@:2}"; else CUDA_VISIBLE_DEVICES=$1 "${@:2}"; fi; }
R=$(mktemp -d /tmp/runs.XXXX); D=$(mktemp -d /tmp/data.XXXX)  # fresh: runs never clobber old ones
Q="--config breakout-minatar-dqn --num-envs 256 --log-every 5 --checkpoint-every 20"

ad() {  # GPU 2
  gpu ${GPU_AD:-2} timeout $T_HIST python3 -m jaxrl_mgpu.histories --env DarkRoom --tasks $TASKS --steps 4000 --out $D/darkroom \
      > $OUT/ad_histories.log 2>&1; echo "histories exit $?" >> $OUT/phases.txt
  gpu ${GPU_AD:-2} timeout $T_AD python3 -m jaxrl_mgpu.train --config darkroom-ad --dataset $D/darkroom --run-dir $R/ad $SIZE_AD \
      > $OUT/ad_train.log 2>&1; echo "ad train exit $?" >> $OUT/phases.txt
  cp $R/ad/metrics.jsonl $OUT/ad_metrics.jsonl
  for mode in "" --greedy; do
    gpu ${GPU_AD:-2} timeout 60 python3 -m jaxrl_mgpu.evaluate --run-dir $R/ad --in-context --episodes $EPISODES $mode \
        > $OUT/ad_incontext$mode.json 2>>$OUT/ad_errors.log; echo "ad eval $mode exit $?" >> $OUT/phases.txt
  done
  cp $R/ad/incontext-test* $OUT/ 2>/dev/null
  [ "${AD_THROUGHPUT:-1}" = 1 ] && gpu ${GPU_AD:-2} timeout 120 python3 -m jaxrl_mgpu.incontext --throughput --config darkroom-ad --dataset $D/darkroom $SIZE_AD \
      > $OUT/ad_throughput.json 2>>$OUT/ad_errors.log; echo "ad throughput exit $?" >> $OUT/phases.txt
}

steps() {  # GPU 3
  for model in "$D512 --precisions fp32 bf16 --attention xla cudnn" \
               "--d-model 128 --n-layers 4 --n-heads 4 --context-len 80 $AD_STEP --precisions fp32 bf16 --attention xla cudnn" \
               "--d-model 128 --n-layers 4 --n-heads 2 --context-len 80 $AD_STEP --precisions bf16 --attention cudnn"; do
    gpu 3 timeout 120 python3 -m jaxrl_mgpu.bench --transformer-step $model $STEP_ARGS --out $OUT/bench_transformer.jsonl \
        2>&1 | grep -v "^{" >> $OUT/bench_transformer.txt
  done
}

async_both() {  # GPUs 0-1
  gpu 0,1 timeout $T_ASYNC python3 -m jaxrl_mgpu.train $Q --run-dir $R/async-both --checkpoint-every 1000 $SIZE_ASYNC \
      > $OUT/async_both.log 2>&1; echo "async both exit $?" >> $OUT/phases.txt
  cp $R/async-both/metrics.jsonl $OUT/async_both_metrics.jsonl
}

async_split() {  # a learner on GPU 0, collectors on GPU 1 (and GPU 3)
  local collectors=$1 run=$R/async-split-$1
  gpu 0 timeout $T_ASYNC python3 -m jaxrl_mgpu.train $Q --run-dir $run --mode learn $SIZE_ASYNC \
      > $OUT/async_learner_$collectors.log 2>&1 &
  local pids=($!)
  sleep 3
  for c in $(seq 1 $collectors); do
    g=$([ $c = 1 ] && echo 1 || echo 3)
    gpu $g timeout $((T_ASYNC - 3)) python3 -m jaxrl_mgpu.train $Q --run-dir $run --mode collect --collector-id gpu$g \
        --collect-before-checkpoint random $SIZE_ASYNC > $OUT/async_collector_${collectors}_gpu$g.log 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  echo "async split $collectors done" >> $OUT/phases.txt
  cp $run/metrics.jsonl $OUT/async_split_${collectors}_metrics.jsonl
}

# PHASES picks what runs (default all): e.g. PHASES=async after a scaling run on the same machine.
PHASES=${PHASES:-"ad steps async"}
has() { [[ " $PHASES " == *" $1 "* ]]; }
has ad && { ad & }
has steps && { steps & STEPS_PID=$!; }
if has async; then
  async_both; async_split 1
  [ -n "$STEPS_PID" ] && wait $STEPS_PID
  async_split 2
fi
wait
echo "--- summary"
cat $OUT/phases.txt; cat $OUT/bench_transformer.txt 2>/dev/null
for f in $OUT/async_*.log; do echo "$f"; grep -v "^update \|^\[Gloo\]\|WARNING" $f | tail -n 3; done
has ad && { tail -n 2 $OUT/ad_histories.log $OUT/ad_train.log; cat $OUT/ad_incontext*.json $OUT/ad_throughput.json; }
