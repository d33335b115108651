from genforge.cli import main

main()
