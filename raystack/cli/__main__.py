from raystack.cli import main

main()
