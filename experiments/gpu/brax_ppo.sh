# Issue 50: PPO on a Brax task, this project's (`--config brax-TASK`) against Brax's own trainer
# with its published configuration (brax_anchor.py), side by side on one GPU, one seed after the
# other; then, with SEEDS_IN_ONE set, this project's seeds in one program (--num-seeds).
# Needs the Brax wheels (../shared/gpu/fetch-wheels.sh --brax). Run from the repo root:
#   TASK=ant SEEDS="0" bash experiments/gpu/brax_ppo.sh
#   TASK=ant STEPS=5000000 bash experiments/gpu/brax_ppo.sh        # a shorter run: throughput
#   TASK=ant SEEDS_IN_ONE=3 ANCHOR=0 bash experiments/gpu/brax_ppo.sh
#   TASK=dmc:CheetahRun PRESET=dmc-cheetah-run T=590 bash experiments/gpu/brax_ppo.sh   # Playground's trainer
#   ANCHOR=0 RESUME=1 TASK=dmc:HumanoidWalk PRESET=dmc-humanoid-walk T=585 bash ...     # again in the next call:
#       a run longer than one call (the time limit's SIGTERM saves a checkpoint) goes on where it stopped
# Prints one JSON line per run (ours.jsonl, anchor.jsonl under $OUT) and a table.
source experiments/gpu/setup.sh
TASK=${TASK:-ant}; PRESET=${PRESET:-brax-$TASK}; SEEDS=${SEEDS:-0}; T=${T:-290}; ANCHOR=${ANCHOR:-1}
NAME=${TASK#*:}
source experiments/gpu/ours.sh  # ours NAME FLAGS...
for seed in $SEEDS; do
  if [ "$ANCHOR" = 1 ]; then
    timeout $T python3 experiments/gpu/brax_anchor.py $TASK --seeds $seed ${STEPS:+--timesteps $STEPS} \
        >> $OUT/anchor.jsonl 2>> $OUT/anchor.err || echo "anchor seed $seed: exit $?" >> $OUT/anchor.err
  fi
  ours ours-$NAME-$seed --seed $seed
done
if [ -n "${SEEDS_IN_ONE:-}" ]; then  # many runs take no --eval-every: evaluated after, every run
  ours ours-$NAME-seeds$SEEDS_IN_ONE --num-seeds $SEEDS_IN_ONE --eval-every 0
  timeout 120 python3 -m jaxrl_mgpu.evaluate --run-dir /tmp/runs/ours-$NAME-seeds$SEEDS_IN_ONE --episodes 128 \
      > $OUT/seeds_eval.jsonl 2>> $OUT/anchor.err
fi
table  # ours.sh
