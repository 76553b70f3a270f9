"""``python -m tabletune.pipeline registry ...`` (see tabletune.pipeline.cli)."""

import sys

from tabletune.pipeline.cli import main

sys.exit(main())
