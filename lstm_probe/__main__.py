from lstm_probe.cli.app import main

main()
