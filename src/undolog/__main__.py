from undolog._entry import main

main()
