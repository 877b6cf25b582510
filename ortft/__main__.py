from ortft.cli import main

main()
