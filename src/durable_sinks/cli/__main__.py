from durable_sinks.cli import main

main()
