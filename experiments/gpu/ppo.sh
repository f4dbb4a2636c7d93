# PPO measurements for experiments/RESULTS.md: throughput on 1 and 2 GPUs (and the hand-fused
# single-file baseline), then the two MinAtar presets trained side by side, one per GPU.
# Run from the repo root on a 2-GPU machine:  bash experiments/gpu/ppo.sh
source experiments/gpu/setup.sh
set -o pipefail
timeout 240 python3 -m jaxrl_mgpu.bench --envs-per-device 2048 16384 --devices 1 2 --baseline \
    --num-steps 128 --updates 5 --repeats 5 --out $OUT/bench_ppo.jsonl 2>&1 | grep -v "^{" | tee $OUT/bench_ppo.txt
for game in breakout spaceinvaders; do
  gpu=$([ $game = breakout ] && echo 0 || echo 1)
  (CUDA_VISIBLE_DEVICES=$gpu timeout 420 python3 -m jaxrl_mgpu.train --config $game-minatar \
       --run-dir /tmp/runs/$game --eval-every 100 --eval-episodes 256 > $OUT/train_$game.log 2>&1;
   cp /tmp/runs/$game/metrics.jsonl $OUT/metrics_$game.jsonl) &
done
wait
for game in breakout spaceinvaders; do
  tail -3 $OUT/train_$game.log
  python3 -m jaxrl_mgpu.evaluate --run-dir /tmp/runs/$game --episodes 1024 | tee -a $OUT/eval_$game.json
done
