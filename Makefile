# eoskit's commands. `make test` is the one CI runs (through .ci/run).
SHELL := bash

.PHONY: test bench services services-stop clean-services

# Starts Kafka and PostgreSQL (or reuses running ones), runs gofmt, go vet and
# every test with -race against them, and stops what it started.
test:
	@scripts/test.sh

# Starts the local broker and PostgreSQL for working by hand; prints the
# variables to export.
services:
	@scripts/kafka.sh start
	@scripts/postgres.sh start

services-stop:
	@scripts/kafka.sh stop
	@scripts/postgres.sh stop

# Stops the broker and deletes its data (the downloaded jars stay cached).
clean-services:
	@scripts/kafka.sh clean

# Measures eos.Processor against an at-least-once loop and a raw franz-go
# GroupTransactSession on the local broker, and prints a markdown table.
bench:
	@scripts/with-services.sh go run ./internal/cmd/eosbench
