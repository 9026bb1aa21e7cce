#!/bin/sh
KAFKA_HEAP_OPTS="-Xmx256m" exec /opt/kafka/bin/kafka-run-class.sh kafka.tools.StorageTool "$@"
