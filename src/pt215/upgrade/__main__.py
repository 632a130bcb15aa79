"""`python -m pt215.upgrade`: the scanner's command line (`pt215.upgrade.cli`)."""

from pt215.upgrade.cli import main

raise SystemExit(main())
