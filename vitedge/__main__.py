from vitedge.cli.entry import main

main()
