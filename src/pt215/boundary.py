"""`python -m pt215.boundary`: the old spelling of `python -m pt215.verify.boundary`, kept so commands still work."""

from pt215.verify.boundary import main

if __name__ == "__main__":
    raise SystemExit(main())
