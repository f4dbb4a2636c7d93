# Multi-agent Tag on GPUs (issue 29). Run through the device tool:
#   bash experiments/gpu/tag.sh train                      both presets on one GPU, then evaluate
#                                                          against random teams
#   bash experiments/gpu/tag.sh bench [DEVICE COUNTS...]   throughput, training included
# JSON lines and logs go to $OUT.
source experiments/gpu/setup.sh
mode=$1; shift
# WarpDrive's paper scale for the continuous game: 1000 agents per environment (100 taggers,
# 900 runners: its run config's 1 : 10), each seeing its 10 nearest others.
CONT1000="--env-args num_taggers=100,num_runners=900,grid_length=60.0,episode_length=500,use_full_observation=false,num_other_agents_observed=10,num_acceleration_levels=20,num_turn_levels=20,max_acceleration=0.1,min_acceleration=-0.1,max_turn=2.356,min_turn=-2.356,max_speed=1.0,tag_reward_for_tagger=10.0,tag_penalty_for_runner=-10.0,end_of_game_reward_for_runner=1.0,tagging_distance=0.02"
bench() { python3 -m jaxrl_mgpu.bench --updates 3 --repeats 5 --out $OUT/bench.jsonl "$@" 2>&1 | grep -vE '^\{' ; }
if [ "$mode" = train ]; then
  for p in gridworld continuous; do
    timeout ${TRAIN_S:-240} python3 -m jaxrl_mgpu.train --config tag-$p --devices 1 --run-dir /tmp/tag-$p 2>&1 | grep -v "^  " | tail -3
    python3 -m jaxrl_mgpu.evaluate --run-dir /tmp/tag-$p --devices 1 --episodes ${EVAL_EPISODES:-2000} | tee $OUT/eval-$p.jsonl
    cp /tmp/tag-$p/metrics.jsonl $OUT/metrics-$p.jsonl
  done
fi
if [ "$mode" = bench ]; then
  devs=${*:-1}
  bench --config tag-gridworld --devices $devs --envs-per-device 32000
  bench --config tag-continuous --devices $devs --envs-per-device 1000
  # the work of WarpDrive's trainer (A2C): one gradient step per batch
  bench --config tag-continuous --devices $devs --envs-per-device 1000 --update-epochs 1 --num-minibatches 1
  bench --config tag-continuous --devices $devs --envs-per-device 1000 --update-epochs 1 --num-minibatches 1 --precision bf16
  bench --config tag-continuous $CONT1000 --devices 1 --envs-per-device 256 --num-steps 20
fi
