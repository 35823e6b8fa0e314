from jobwire.cli import main

main()
