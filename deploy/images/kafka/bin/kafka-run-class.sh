#!/bin/sh
# java with the broker's jars and the image's log4j2 configuration, as Kafka's own script does.
exec java ${KAFKA_HEAP_OPTS:-} ${KAFKA_OPTS:-} -cp "/opt/kafka/libs/*" \
  -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties "$@"
