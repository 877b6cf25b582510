from ortft.cli.app import main

main()
