# The off-policy, AD and asynchronous measurements of experiments/RESULTS.md, on a 2-GPU machine
# in one call (device time is scarce: every phase has a hard time limit):
#   phase 1  DQN on Breakout-MinAtar (GPU 0) and SpaceInvaders-MinAtar (GPU 1), side by side;
#            the AD learning histories are made meanwhile on GPU 0
#   phase 2  asynchronous DQN: `--mode both` on both GPUs, then a learner on GPU 0 with a
#            collector on GPU 1, for the same wall time each
#   phase 3  AD training + in-context evaluation (GPU 0); PPO Breakout seeds 1-2 and the
#            AD-size transformer step at a larger batch (GPU 1)
# Run from the repo root:  bash experiments/gpu/run.sh final
# DRY=1 runs the same commands at toy sizes (for checking the script on a CPU machine).
source experiments/gpu/setup.sh
set -o pipefail
T_DQN=${T_DQN:-170}; T_ASYNC=${T_ASYNC:-35}; T_AD=${T_AD:-50}
SIZE_DQN=""; SIZE_ASYNC=""; SIZE_AD="--ad-batch-size 32 --num-updates 3000"; TASKS=256; PPO_STEPS=10000000
if [ "${DRY:-0}" = 1 ]; then
  T_DQN=40; T_ASYNC=20; T_AD=40
  SIZE_DQN="--total-timesteps 40960 --learning-starts 4096 --buffer-size 16384 --log-every 5"
  SIZE_ASYNC="--total-timesteps 409600 --learning-starts 2048 --buffer-size 16384 --log-every 5 --checkpoint-every 5"
  SIZE_AD="--ad-batch-size 8 --num-updates 40 --log-every 10 --checkpoint-every 20"; TASKS=16; PPO_STEPS=65536
fi
gpu() { if [ "${DRY:-0}" = 1 ]; then env -u CUDA_VISIBLE_DEVICES "${@:2}"; else CUDA_VISIBLE_DEVICES=$1 "${@:2}"; fi; }
R=/tmp/runs; mkdir -p $R /tmp/data

echo "--- phase 1: DQN on MinAtar, AD histories"
for game in breakout spaceinvaders; do
  g=$([ $game = breakout ] && echo 0 || echo 1)
  (gpu $g timeout $T_DQN python3 -m jaxrl_mgpu.train --config $game-minatar-dqn --run-dir $R/dqn-$game \
       --checkpoint-every 0 $SIZE_DQN > $OUT/dqn_$game.log 2>&1; echo "dqn $game exit $?" >> $OUT/phases.txt) &
done
gpu 0 timeout 150 python3 -m jaxrl_mgpu.histories --env DarkRoom --tasks $TASKS --steps 4000 \
    --out /tmp/data/darkroom > $OUT/histories.log 2>&1; echo "histories exit $?" >> $OUT/phases.txt
wait
for game in breakout spaceinvaders; do
  g=$([ $game = breakout ] && echo 0 || echo 1)
  cp $R/dqn-$game/metrics.jsonl $OUT/dqn_metrics_$game.jsonl 2>/dev/null
  (gpu $g timeout 30 python3 -m jaxrl_mgpu.evaluate --run-dir $R/dqn-$game --episodes 256 --greedy \
       > $OUT/dqn_eval_$game.json 2>>$OUT/phases.txt) &
done
wait

echo "--- phase 2: asynchronous DQN (Breakout-MinAtar) vs --mode both"
gpu 0,1 timeout $T_ASYNC python3 -m jaxrl_mgpu.train --config breakout-minatar-dqn --run-dir $R/async-both \
    --num-envs 256 --log-every 10 $SIZE_ASYNC > $OUT/async_both.log 2>&1
cp $R/async-both/metrics.jsonl $OUT/async_both_metrics.jsonl
gpu 0 timeout $T_ASYNC python3 -m jaxrl_mgpu.train --config breakout-minatar-dqn --run-dir $R/async-split \
    --mode learn --num-envs 256 --log-every 10 --checkpoint-every 20 $SIZE_ASYNC > $OUT/async_learner.log 2>&1 &
sleep 3
gpu 1 timeout $((T_ASYNC - 3)) python3 -m jaxrl_mgpu.train --config breakout-minatar-dqn --run-dir $R/async-split \
    --mode collect --num-envs 256 --collector-id gpu1 --collect-before-checkpoint random $SIZE_ASYNC \
    > $OUT/async_collector.log 2>&1
wait
cp $R/async-split/metrics.jsonl $OUT/async_split_metrics.jsonl

echo "--- phase 3: AD (GPU 0); PPO Breakout seeds, AD-size transformer step (GPU 1)"
(gpu 0 timeout $T_AD python3 -m jaxrl_mgpu.train --config darkroom-ad --dataset /tmp/data/darkroom --run-dir $R/ad \
     --d-model 64 --n-layers 2 --n-heads 2 --lr 1e-3 $SIZE_AD > $OUT/ad_train.log 2>&1
 cp $R/ad/metrics.jsonl $OUT/ad_metrics.jsonl
 gpu 0 timeout 40 python3 -m jaxrl_mgpu.evaluate --run-dir $R/ad --in-context --episodes 30 > $OUT/ad_incontext.json 2>>$OUT/phases.txt
 cp $R/ad/incontext-*.png $OUT/ 2>/dev/null
 gpu 0 timeout 30 python3 -m jaxrl_mgpu.incontext --throughput --config darkroom-ad --dataset /tmp/data/darkroom \
     --d-model 64 --n-layers 2 --n-heads 2 $SIZE_AD > $OUT/ad_throughput.json 2>>$OUT/phases.txt) &
(for seed in 1 2; do
   gpu 1 timeout 45 python3 -m jaxrl_mgpu.train --config breakout-minatar --seed $seed --total-timesteps $PPO_STEPS \
       --run-dir $R/ppo-breakout-$seed 2>&1 | grep "^done" | sed "s/^/ppo breakout seed $seed: /" >> $OUT/ppo_seeds.txt
 done
 gpu 1 timeout 45 python3 -m jaxrl_mgpu.bench --transformer-step --d-model 128 --n-layers 4 --n-heads 4 \
     --context-len 80 --batch 4096 --precisions bf16 --attention xla cudnn --repeats 10 2>&1 | grep -v "^{" > $OUT/bench_ad_size.txt) &
wait
echo "--- summary"
cat $OUT/phases.txt; tail -n 2 $OUT/dqn_breakout.log $OUT/dqn_spaceinvaders.log; cat $OUT/dqn_eval_*.json
tail -n 3 $OUT/async_both.log $OUT/async_learner.log $OUT/async_collector.log; cat $OUT/ad_incontext.json $OUT/ad_throughput.json
cat $OUT/ppo_seeds.txt $OUT/bench_ad_size.txt
