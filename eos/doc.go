// Package eos gives Kafka-to-Kafka exactly-once processing on franz-go:
// delivery-semantics presets, idempotent and transactional producers, and a
// consume-transform-produce loop that commits its consumed offsets inside the
// Kafka transaction that carries its output.
package eos
