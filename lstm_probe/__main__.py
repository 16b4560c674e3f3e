from lstm_probe.cli import main

main()
