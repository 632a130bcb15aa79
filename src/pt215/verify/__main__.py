"""`python -m pt215.verify`: the runner's command line (`pt215.verify.runner`)."""

from pt215.verify.runner import main

raise SystemExit(main())
