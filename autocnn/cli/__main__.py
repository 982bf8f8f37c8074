"""``python -m autocnn.cli``: the same command line as the ``autocnn`` console script."""
from autocnn.cli import main

raise SystemExit(main())
