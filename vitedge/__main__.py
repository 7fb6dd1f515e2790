from vitedge.cli import main

main()
