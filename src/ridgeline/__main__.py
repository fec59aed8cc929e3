from ridgeline._entry import main

main()
