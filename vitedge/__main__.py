try:
    from vitedge.cli.entry import main
except ModuleNotFoundError as err:  # the runtime wheel ships the package without its command line
    raise SystemExit(f"vitedge: the command line is not installed here ({err.name} is missing): "
                     "pip install vitedge (the runtime wheel has no command line)") from None

main()
