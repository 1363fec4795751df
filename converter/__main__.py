from converter.cli import main

main()
