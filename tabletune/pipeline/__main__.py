"""``python -m tabletune.pipeline registry ...`` (see tabletune.pipeline.cli)."""

import sys

from tabletune.core.stdout import run_with_pipe_closed_quietly
from tabletune.pipeline.cli import main

sys.exit(run_with_pipe_closed_quietly(main))
