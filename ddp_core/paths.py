"""Where the project's files are, decided once for every part of ddp_core."""

from pathlib import Path

# The checkout that holds the package (installed editable, or run from the checkout): notebooks/, slurm/.
REPO_ROOT = Path(__file__).resolve().parents[1]
# Where runs and measurements go unless told otherwise, relative to the directory a command runs in.
RESULTS_DIR = "results"
