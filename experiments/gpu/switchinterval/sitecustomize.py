"""On PYTHONPATH, sets the interpreter's GIL switch interval to $SWITCH_INTERVAL_S seconds at
start-up (Python's default is 0.005): async_rate.sh's LEARNER_SWITCH_S, to test whether the
learner's main thread loses time waiting for the GIL held by its reader, copier and publisher
threads (up to one interval each time it comes back from a device call)."""
import os
import sys

if os.environ.get("SWITCH_INTERVAL_S"):
    sys.setswitchinterval(float(os.environ["SWITCH_INTERVAL_S"]))
