"""``python -m t5x_like.scaling``: see ``cli``."""

import sys

from t5x_like.scaling.cli import main

sys.exit(main())
