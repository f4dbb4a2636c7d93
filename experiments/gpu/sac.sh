# Issue 62: SAC (or TD3) on a DM Control or Brax task, this project's (`--config PRESET`, its
# seeds in one program) against Brax's own SAC trainer with Playground's brax_sac_config
# (brax_anchor.py --algo sac; DM Control tasks only), side by side on one GPU.
# Needs the Brax and Playground wheels (../shared/gpu/fetch-wheels.sh --brax). From the repo root:
#   TASK=dmc:CheetahRun PRESET=dmc-cheetah-run-sac T=300 bash experiments/gpu/sac.sh
#   TASK=dmc:HumanoidWalk PRESET=dmc-humanoid-walk-sac T=580 CARRY_RUNS=carry RESUME=1 bash experiments/gpu/sac.sh
#       then ANCHOR=0 and the same in the next calls: the run goes on where the time limit stopped it
#   TASK=humanoid PRESET=brax-humanoid-sac ANCHOR=0 bash experiments/gpu/sac.sh   # against RESULTS' Brax PPO
#   PRESET=dmc-humanoid-walk-td3 (or dmc-cheetah-run-td3): TD3 with FastTD3's Playground settings
#   FLAGS="--algo td3" ...: a SAC preset as TD3 (without its --init-alpha); STEPS=N: a shorter run
# DRY=1 T=120 TASK=Pendulum-v1 PRESET=pendulum-sac ANCHOR=0 SEEDS_IN_ONE=2: a CPU check of the script.
# Prints one JSON line per run (ours.jsonl, anchor.jsonl under $OUT), the evaluation of every seed
# (seeds_eval.jsonl: 128 episodes each), a table, and ours' gradient steps per second.
source experiments/gpu/setup.sh
TASK=${TASK:-dmc:CheetahRun}; PRESET=${PRESET:-dmc-cheetah-run-sac}; T=${T:-300}; ANCHOR=${ANCHOR:-1}
SEEDS_IN_ONE=${SEEDS_IN_ONE:-3}
NAME=sac-${TASK#*:}-seeds$SEEDS_IN_ONE
source experiments/gpu/ours.sh  # ours NAME FLAGS...
if [ "$ANCHOR" = 1 ] && [[ $TASK == dmc:* ]]; then
  timeout $T python3 experiments/gpu/brax_anchor.py $TASK --algo sac --seeds 0 ${STEPS:+--timesteps $STEPS} \
      >> $OUT/anchor.jsonl 2>> $OUT/anchor.err || echo "anchor: exit $?" >> $OUT/anchor.err
fi
# many runs take no --eval-every (their curve is the training return); evaluated after, every run
ours $NAME --num-seeds $SEEDS_IN_ONE --eval-every 0 ${FLAGS:-}
timeout 180 python3 -m jaxrl_mgpu.evaluate --run-dir /tmp/runs/$NAME --episodes 128 > $OUT/seeds_eval.jsonl \
    2>> $OUT/anchor.err
table  # ours.sh
cat $OUT/seeds_eval.jsonl
python3 - /tmp/runs/$NAME <<'PY'
import json, statistics, sys
run = sys.argv[1]
cfg = json.load(open(run + "/config.json"))
rows = [json.loads(l) for l in open(run + "/metrics.jsonl")]
steady = statistics.median([r["sps"] for r in rows]) if rows else 0
# an update is num_steps vector steps of num_envs environments and num_steps x updates_per_step gradient steps
print(f"ours: {steady:,.0f} env steps/s, {steady * cfg['updates_per_step'] / cfg['num_envs']:,.0f} gradient steps/s "
      f"of {cfg['replay_batch_size']:,} transitions (median of the rows)")
PY
