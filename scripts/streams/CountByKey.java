import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Comparator;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.Stream;

import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.CloseOptions;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KGroupedStream;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.WindowStore;

import sun.misc.Signal;

/**
 * The Kafka Streams bench peer of tools/bench's state part: counts
 * the input's records by key under exactly_once_v2 and writes each key's
 * count (a big-endian 8-byte long, Serdes.Long) to the output topic.
 *
 * <pre>
 *   builder.stream(in).groupByKey().count().toStream().to(out)
 * </pre>
 *
 * or, given window-ms (and grace-ms, default 0), per key and tumbling
 * window of record time, the output keyed by the record key:
 *
 * <pre>
 *   builder.stream(in).groupByKey()
 *       .windowedBy(TimeWindows.ofSizeAndGrace(window, grace)).count()
 *       .toStream((w, n) -> w.key()).to(out)
 * </pre>
 *
 * or, given table, a stream–table join, each record's output the table's
 * value of its key (records of keys the table lacks have none):
 *
 * <pre>
 *   builder.stream(in).join(builder.table(table), (v, t) -> t).to(out)
 * </pre>
 *
 * Keys are Bytes (compared by content), values opaque bytes; the count's
 * store is named "counts" (its changelog: APPLICATION_ID-counts-changelog,
 * which Streams creates), RocksDB unless store=memory (Streams'
 * in-memory key-value store). Given restored-exit=N, the peer times the
 * count's restore instead: once N changelog partitions have been restored
 * (a StateRestoreListener's onRestoreEnd), it prints one line to stdout,
 * "restored records=R span_ms=S from_start_ms=T" (the records restored;
 * from the first partition's restore start to the last one's end; from
 * just before KafkaStreams.start() to that end), then closes, leaving the
 * group, and exits 0. Given log-restores=true, it prints each restored
 * partition instead, "restored partition=P records=R took_ms=T".
 * standbys sets num.standby.replicas, client-id client.id; given
 * leave-group=true, a SIGTERM closes Streams leaving the group (as a
 * rolling restart's instance should, rather than hold its partitions for
 * the session timeout).
 * tools/bench fills APPLICATION_ID-counts-changelog itself before the
 * start, so that Streams finds it there. Everything not
 * given keeps Kafka Streams' default, commit.interval.ms included (100 ms
 * under exactly-once) and the record cache (10 MiB: a key's count is sent at
 * commit, once per commit). The state directory is a fresh temporary one,
 * deleted on exit. SIGTERM or SIGINT closes Streams (committing what it
 * processed) and exits 0; Streams failing exits 1.
 *
 * Run it through scripts/streams.sh run; arguments, as name=value:
 * bootstrap, application-id, input, output, replication-factor (all
 * required), threads (num.stream.threads, default 1), commit-interval-ms
 * (default: Streams' own), window-ms and grace-ms, table, store,
 * restored-exit, log-restores, standbys, client-id, leave-group.
 */
public final class CountByKey {
    public static void main(String[] argv) throws Exception {
        Map<String, String> args = parse(argv);
        String in = required(args, "input");
        String out = required(args, "output");
        Path stateDir = Files.createTempDirectory("eoskit-streams-");

        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, required(args, "bootstrap"));
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, required(args, "application-id"));
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, Integer.parseInt(required(args, "replication-factor")));
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(args.getOrDefault("threads", "1")));
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toString());
        if (args.containsKey("commit-interval-ms")) {
            props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, Long.parseLong(args.get("commit-interval-ms")));
        }
        if (args.containsKey("standbys")) {
            props.put(StreamsConfig.NUM_STANDBY_REPLICAS_CONFIG, Integer.parseInt(args.get("standbys")));
        }
        if (args.containsKey("client-id")) {
            props.put(StreamsConfig.CLIENT_ID_CONFIG, args.get("client-id"));
        }

        StreamsBuilder builder = new StreamsBuilder();
        KStream<Bytes, byte[]> stream = builder.stream(in, Consumed.with(Serdes.Bytes(), Serdes.ByteArray()));
        if (args.containsKey("table")) {
            KTable<Bytes, byte[]> table = builder.table(args.get("table"), Consumed.with(Serdes.Bytes(), Serdes.ByteArray()));
            stream.join(table, (v, t) -> t).to(out, Produced.with(Serdes.Bytes(), Serdes.ByteArray()));
        } else if (args.containsKey("window-ms")) {
            KGroupedStream<Bytes, byte[]> grouped = stream.groupByKey(Grouped.with(Serdes.Bytes(), Serdes.ByteArray()));
            Duration size = Duration.ofMillis(Long.parseLong(args.get("window-ms")));
            Duration grace = Duration.ofMillis(Long.parseLong(args.getOrDefault("grace-ms", "0")));
            grouped.windowedBy(TimeWindows.ofSizeAndGrace(size, grace))
                    .count(Materialized.<Bytes, Long, WindowStore<Bytes, byte[]>>as("counts")
                            .withKeySerde(Serdes.Bytes())
                            .withValueSerde(Serdes.Long()))
                    .toStream((w, n) -> w.key())
                    .to(out, Produced.with(Serdes.Bytes(), Serdes.Long()));
        } else {
            Materialized<Bytes, Long, KeyValueStore<Bytes, byte[]>> counts = "memory".equals(args.get("store"))
                    ? Materialized.<Bytes, Long>as(Stores.inMemoryKeyValueStore("counts"))
                    : Materialized.<Bytes, Long, KeyValueStore<Bytes, byte[]>>as("counts");
            stream.groupByKey(Grouped.with(Serdes.Bytes(), Serdes.ByteArray()))
                    .count(counts.withKeySerde(Serdes.Bytes()).withValueSerde(Serdes.Long()))
                    .toStream()
                    .to(out, Produced.with(Serdes.Bytes(), Serdes.Long()));
        }

        CountDownLatch done = new CountDownLatch(1);
        AtomicReference<Throwable> failure = new AtomicReference<>();
        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        streams.setUncaughtExceptionHandler(e -> {
            failure.compareAndSet(null, e);
            done.countDown();
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.setStateListener((to, from) -> {
            System.err.println("CountByKey: " + from + " -> " + to);
            if (to == KafkaStreams.State.ERROR) {
                failure.compareAndSet(null, new IllegalStateException("Kafka Streams went into ERROR"));
                done.countDown();
            }
        });
        // Handling the signals (rather than a shutdown hook) lets main close
        // Streams and return, so the JVM exits 0 and not 143.
        Signal.handle(new Signal("TERM"), s -> done.countDown());
        Signal.handle(new Signal("INT"), s -> done.countDown());

        long start = System.nanoTime();
        if (args.containsKey("restored-exit")) {
            streams.setGlobalStateRestoreListener(restoreTimer(Integer.parseInt(args.get("restored-exit")), start, done));
        } else if (args.containsKey("log-restores")) {
            streams.setGlobalStateRestoreListener(restoreLogger());
        }
        streams.start();
        done.await();
        // A timed restore leaves the group as it closes, so that the next
        // run of the same application id is not held for the session
        // timeout by a member gone; otherwise Streams' default (stay, for
        // a restart to rejoin) holds.
        CloseOptions close = CloseOptions.timeout(Duration.ofSeconds(60));
        if (args.containsKey("restored-exit") || args.containsKey("leave-group")) {
            close = close.withGroupMembershipOperation(CloseOptions.GroupMembershipOperation.LEAVE_GROUP);
        }
        boolean closed = streams.close(close);
        deleteTree(stateDir);
        Throwable err = failure.get();
        if (err != null) {
            System.err.println("CountByKey: failed: " + err);
            err.printStackTrace();
            System.exit(1);
        }
        if (!closed) {
            System.err.println("CountByKey: Kafka Streams did not close within 60 s");
            System.exit(1);
        }
        System.exit(0);
    }

    /**
     * restoreTimer returns a listener that, once partitions changelog
     * partitions have been restored, prints what restoring them took and
     * counts done down.
     */
    private static StateRestoreListener restoreTimer(int partitions, long start, CountDownLatch done) {
        AtomicLong first = new AtomicLong();
        AtomicLong records = new AtomicLong();
        AtomicLong ended = new AtomicLong();
        return new StateRestoreListener() {
            @Override
            public void onRestoreStart(TopicPartition tp, String store, long startOffset, long endOffset) {
                first.compareAndSet(0, System.nanoTime());
            }

            @Override
            public void onBatchRestored(TopicPartition tp, String store, long batchEndOffset, long numRestored) {}

            @Override
            public void onRestoreEnd(TopicPartition tp, String store, long totalRestored) {
                long now = System.nanoTime();
                records.addAndGet(totalRestored);
                if (ended.incrementAndGet() == partitions) {
                    System.out.printf("restored records=%d span_ms=%.1f from_start_ms=%.1f%n",
                            records.get(), (now - first.get()) / 1e6, (now - start) / 1e6);
                    System.out.flush();
                    done.countDown();
                }
            }
        };
    }

    /**
     * restoreLogger returns a listener that prints each restored changelog
     * partition to stdout: "restored partition=P records=R took_ms=T".
     */
    private static StateRestoreListener restoreLogger() {
        Map<TopicPartition, Long> started = new java.util.concurrent.ConcurrentHashMap<>();
        return new StateRestoreListener() {
            @Override
            public void onRestoreStart(TopicPartition tp, String store, long startOffset, long endOffset) {
                started.put(tp, System.nanoTime());
            }

            @Override
            public void onBatchRestored(TopicPartition tp, String store, long batchEndOffset, long numRestored) {}

            @Override
            public void onRestoreEnd(TopicPartition tp, String store, long totalRestored) {
                long took = System.nanoTime() - started.getOrDefault(tp, System.nanoTime());
                System.out.printf("restored partition=%d records=%d took_ms=%.1f%n", tp.partition(), totalRestored, took / 1e6);
                System.out.flush();
            }
        };
    }

    private static Map<String, String> parse(String[] argv) {
        Map<String, String> args = new HashMap<>();
        for (String a : argv) {
            int eq = a.indexOf('=');
            if (eq <= 0) {
                usage("argument " + a + " is not name=value");
            }
            args.put(a.substring(0, eq), a.substring(eq + 1));
        }
        return args;
    }

    private static String required(Map<String, String> args, String name) {
        String v = args.get(name);
        if (v == null || v.isEmpty()) {
            usage("missing " + name + "=...");
        }
        return v;
    }

    private static void usage(String why) {
        System.err.println("CountByKey: " + why + "\nusage: CountByKey bootstrap=HOST:PORT application-id=ID input=TOPIC output=TOPIC "
                + "replication-factor=N [threads=1] [commit-interval-ms=MS] [window-ms=MS [grace-ms=MS] | table=TOPIC | store=memory] [restored-exit=PARTITIONS | log-restores=true] [standbys=N] [client-id=ID] [leave-group=true]");
        System.exit(2);
    }

    private static void deleteTree(Path root) throws IOException {
        try (Stream<Path> paths = Files.walk(root)) {
            paths.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        }
    }
}
