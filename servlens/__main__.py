from servlens.cli import main

main()
