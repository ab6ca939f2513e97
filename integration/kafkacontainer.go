package integration

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/testsupport/freeport"
)

type kafkaConfig struct {
	common
	nodes int
}

type nodesOpt int

func (o nodesOpt) applyKafka(c *kafkaConfig) { c.nodes = int(o) }

// WithNodes runs a cluster of n combined KRaft nodes (broker and
// controller each) instead of one: every partition, internal ones
// included, then has min(n, 3) replicas, min.insync.replicas one less,
// and no unclean leader election. It needs the host network
// ([WithHostNetwork]). Default: 1.
func WithNodes(n int) KafkaOption { return nodesOpt(n) }

// KafkaContainer is Apache Kafka running in Docker: one container per
// node, each with its data on a volume of its own.
type KafkaContainer struct {
	cfg     kafkaConfig
	layout  *kafkaLayout
	nodes   []*kafkaNode
	brokers []string
}

type kafkaNode struct {
	ctr    testcontainers.Container
	volume string
}

// Brokers returns the bootstrap addresses, one per node.
func (k *KafkaContainer) Brokers() []string { return k.brokers }

// Nodes returns the number of nodes; they are numbered from 1.
func (k *KafkaContainer) Nodes() int { return len(k.nodes) }

func (k *KafkaContainer) node(n int) (*kafkaNode, error) {
	if n < 1 || n > len(k.nodes) || k.nodes[n-1] == nil || k.nodes[n-1].ctr == nil {
		return nil, fmt.Errorf("integration: no kafka node %d (there are %d)", n, len(k.nodes))
	}
	return k.nodes[n-1], nil
}

// Stop stops node n as `docker stop` does: SIGTERM, then SIGKILL once
// timeout (whole seconds, rounded up) has passed. Its data stays on its
// volume; [KafkaContainer.Start] brings it back.
func (k *KafkaContainer) Stop(ctx context.Context, n int, timeout time.Duration) error {
	node, err := k.node(n)
	if err != nil {
		return err
	}
	if timeout < 0 {
		return fmt.Errorf("integration: stop kafka node %d: negative timeout %v", n, timeout)
	}
	if r := timeout % time.Second; r != 0 {
		timeout += time.Second - r // Docker counts whole seconds
	}
	if err := node.ctr.Stop(ctx, &timeout); err != nil {
		return fmt.Errorf("integration: stop kafka node %d: %w", n, err)
	}
	return nil
}

// Kill sends node n SIGKILL, as a crash would. Its data stays on its
// volume; [KafkaContainer.Start] brings it back.
func (k *KafkaContainer) Kill(ctx context.Context, n int) error {
	return k.engine(ctx, n, "kill", func(cli client.APIClient, id string) error {
		_, err := cli.ContainerKill(ctx, id, client.ContainerKillOptions{Signal: "KILL"})
		return err
	})
}

// Pause freezes every process of node n (docker pause: the cgroup
// freezer), as a broker hung in a long GC pause or a stalled VM: its
// connections stay open and nothing answers on them. The cluster notices
// once its controller's session with the node times out.
// [KafkaContainer.Unpause] lets it go on where it stopped.
func (k *KafkaContainer) Pause(ctx context.Context, n int) error {
	return k.engine(ctx, n, "pause", func(cli client.APIClient, id string) error {
		_, err := cli.ContainerPause(ctx, id, client.ContainerPauseOptions{})
		return err
	})
}

// Unpause lets a paused node n go on, and returns once the cluster is
// whole, as [KafkaContainer.Start] does.
func (k *KafkaContainer) Unpause(ctx context.Context, n int) error {
	if err := k.engine(ctx, n, "unpause", func(cli client.APIClient, id string) error {
		_, err := cli.ContainerUnpause(ctx, id, client.ContainerUnpauseOptions{})
		return err
	}); err != nil {
		return err
	}
	if err := k.waitWhole(ctx, n); err != nil {
		return fmt.Errorf("integration: kafka node %d unpaused: %w", n, err)
	}
	return nil
}

// engine runs do on node n's container through the Docker engine.
func (k *KafkaContainer) engine(ctx context.Context, n int, verb string, do func(cli client.APIClient, id string) error) error {
	node, err := k.node(n)
	if err != nil {
		return err
	}
	p, err := k.cfg.provider()
	if err != nil {
		return fmt.Errorf("integration: %s kafka node %d: %w", verb, n, err)
	}
	defer p.Close()
	if err := do(p.Client(), node.ctr.GetContainerID()); err != nil {
		return fmt.Errorf("integration: %s kafka node %d: %w", verb, n, err)
	}
	return nil
}

// Start starts node n again on its data and returns once every node is a
// broker and every replica of every partition is in sync (so every other
// node must be running).
func (k *KafkaContainer) Start(ctx context.Context, n int) error {
	node, err := k.node(n)
	if err != nil {
		return err
	}
	if err := node.ctr.Start(ctx); err != nil {
		return fmt.Errorf("integration: start kafka node %d: %w", n, err)
	}
	if err := k.waitWhole(ctx, n); err != nil {
		return fmt.Errorf("integration: kafka node %d started: %w", n, err)
	}
	return nil
}

// Replace kills node n, removes its container, as a lost machine whose
// disk survives, and runs a new container with the same settings on the
// node's volume: the new node knows only what the volume kept. It returns
// once the cluster is whole, as [KafkaContainer.Start] does.
func (k *KafkaContainer) Replace(ctx context.Context, n int) error {
	node, err := k.node(n)
	if err != nil {
		return err
	}
	// A stopped node is replaced as it is; a running one is killed first.
	if st, err := node.ctr.State(ctx); err != nil {
		return fmt.Errorf("integration: replace kafka node %d: %w", n, err)
	} else if st.Running {
		if err := k.Kill(ctx, n); err != nil {
			return err
		}
	}
	// Terminate removes the container and its anonymous volumes only; the
	// node's named volume stays.
	if err := node.ctr.Terminate(ctx); err != nil {
		return fmt.Errorf("integration: remove kafka node %d: %w", n, err)
	}
	node.ctr = nil // until its successor runs: Terminate then removes the volume alone
	ctr, err := k.run(ctx, n-1, node.volume)
	if ctr != nil {
		node.ctr = ctr
	}
	if err != nil {
		return fmt.Errorf("integration: replace kafka node %d: %w", n, err)
	}
	if err := k.waitWhole(ctx, n); err != nil {
		return fmt.Errorf("integration: kafka node %d replaced: %w", n, err)
	}
	return nil
}

// Volume returns the name of node n's volume (where its log.dirs are).
func (k *KafkaContainer) Volume(n int) (string, error) {
	node, err := k.node(n)
	if err != nil {
		return "", err
	}
	return node.volume, nil
}

// Logs returns the last lines (at most max) of node n's output.
func (k *KafkaContainer) Logs(ctx context.Context, n, max int) (string, error) {
	node, err := k.node(n)
	if err != nil {
		return "", err
	}
	return lastLines(ctx, node.ctr, max)
}

// Terminate removes every node and its volume, at once: the nodes are
// killed, not stopped, since their data goes too.
func (k *KafkaContainer) Terminate(ctx context.Context) error {
	var errs []error
	for i, node := range k.nodes {
		switch {
		case node == nil:
		case node.ctr == nil: // Replace failed between the two containers
			if err := k.removeVolume(ctx, node.volume); err != nil {
				errs = append(errs, fmt.Errorf("integration: remove kafka node %d's volume: %w", i+1, err))
			}
		default:
			if err := node.ctr.Terminate(ctx, testcontainers.StopTimeout(0), testcontainers.RemoveVolumes(node.volume)); err != nil {
				errs = append(errs, fmt.Errorf("integration: terminate kafka node %d: %w", i+1, err))
			}
		}
	}
	return errors.Join(errs...)
}

func (k *KafkaContainer) removeVolume(ctx context.Context, name string) error {
	p, err := k.cfg.provider()
	if err != nil {
		return err
	}
	defer p.Close()
	_, err = p.Client().VolumeRemove(ctx, name, client.VolumeRemoveOptions{Force: true})
	return err
}

// StartKafka always starts Kafka in Docker, whatever the environment says,
// and terminates it when tb ends: for tests that stop, kill, pause or
// replace nodes. It skips (or with EOS_REQUIRE_SERVICES=1 fails) tb when
// Docker does not answer, and fails it when the containers do not come up.
func StartKafka(tb testing.TB, opts ...KafkaOption) *KafkaContainer {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	k, err := RunKafka(ctx, append([]KafkaOption{testLogger(tb)}, opts...)...)
	if err != nil {
		containerFailed(tb, "Kafka", kafkaHowTo, err)
	}
	tb.Cleanup(func() { terminate(tb, "kafka", k.Terminate) })
	return k
}

// RunKafka starts Apache Kafka in Docker and returns once every node is a
// broker. The caller terminates it. An error wrapping [ErrNoDocker] means
// Docker did not answer; on any error, what had started is terminated
// already.
func RunKafka(ctx context.Context, opts ...KafkaOption) (*KafkaContainer, error) {
	cfg := kafkaConfig{common: defaults(KafkaImageEnv, DefaultKafkaImage), nodes: 1}
	for _, o := range opts {
		o.applyKafka(&cfg)
	}
	if cfg.nodes < 1 {
		return nil, fmt.Errorf("integration: WithNodes(%d): a cluster has at least one node", cfg.nodes)
	}
	if cfg.nodes > 1 && !cfg.host {
		return nil, fmt.Errorf("integration: a cluster of %d nodes needs the host network (WithHostNetwork(true) or %s=host)", cfg.nodes, DockerNetworkEnv)
	}
	if err := dockerAnswers(ctx, cfg.common); err != nil {
		return nil, err
	}
	layout, err := newKafkaLayout(ctx, cfg)
	if err != nil {
		return nil, err
	}
	k := &KafkaContainer{cfg: cfg, layout: layout, nodes: make([]*kafkaNode, cfg.nodes), brokers: layout.brokers()}
	// The nodes start together: a node of a cluster becomes a broker
	// (and logs so, what each container waits for) only once a majority
	// of the controllers runs.
	errs := make([]error, cfg.nodes)
	// One node failing ends the others' wait.
	startCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for i := range cfg.nodes {
		volume := "eoskit-kafka-" + strings.ToLower(layout.clusterID) + "-" + strconv.Itoa(i+1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctr, err := k.run(startCtx, i, volume)
			k.nodes[i] = &kafkaNode{ctr: ctr, volume: volume}
			if err != nil {
				errs[i] = fmt.Errorf("node %d: %w", i+1, err)
				cancel()
			}
		}()
	}
	wg.Wait()
	err = errors.Join(errs...)
	if err == nil {
		err = k.waitWhole(ctx, 0)
	}
	if err != nil {
		err = fmt.Errorf("integration: %s did not come up: %w", cfg.image, err)
		stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return nil, errors.Join(err, k.Terminate(stopCtx))
	}
	return k, nil
}

// run starts the container of node i on volume and waits until it logs
// that its broker started.
// A container that was never created comes back as nil.
func (k *KafkaContainer) run(ctx context.Context, i int, volume string) (testcontainers.Container, error) {
	ctr, err := testcontainers.Run(ctx, k.cfg.image, append(k.layout.customize(i, volume, k.cfg),
		testcontainers.WithWaitStrategyAndDeadline(2*time.Minute, wait.ForLog("Kafka Server started")))...)
	if ctr == nil { // not a nil *DockerContainer inside the interface
		return nil, err
	}
	return ctr, err
}

// kafkaLayout holds the addresses of a cluster: on the host network every
// listener of every node has a free 127.0.0.1 port; with published ports
// (one node) the client listener's container port 9092 is published on a
// fixed free host port, so that it stays the same across a restart.
type kafkaLayout struct {
	nodes     int
	host      bool
	clusterID string
	// ports[i] are node i's client, broker and controller ports.
	ports      [][3]int
	daemonHost string
}

func newKafkaLayout(ctx context.Context, cfg kafkaConfig) (*kafkaLayout, error) {
	// Kafka's own random ids never start with "-": StorageTool would
	// take one for an option.
	clusterID := "-"
	for strings.HasPrefix(clusterID, "-") {
		var id [16]byte
		if _, err := rand.Read(id[:]); err != nil {
			return nil, err
		}
		clusterID = base64.RawURLEncoding.EncodeToString(id[:])
	}
	l := &kafkaLayout{nodes: cfg.nodes, host: cfg.host, clusterID: clusterID}
	free, err := freeport.Ports(3 * cfg.nodes)
	if err != nil {
		return nil, err
	}
	for i := range cfg.nodes {
		l.ports = append(l.ports, [3]int{free[3*i], free[3*i+1], free[3*i+2]})
	}
	l.daemonHost = "127.0.0.1"
	if !cfg.host {
		if l.daemonHost, err = cfg.daemonHost(ctx); err != nil {
			return nil, err
		}
	}
	return l, nil
}

func (l *kafkaLayout) brokers() []string {
	out := make([]string, l.nodes)
	for i := range l.nodes {
		out[i] = net.JoinHostPort(l.daemonHost, strconv.Itoa(l.ports[i][0]))
	}
	return out
}

// env is node i's configuration, as the official image reads it: the
// settings of scripts/kafka.sh (one node) or scripts/kafka-cluster.sh.
func (l *kafkaLayout) env(i int) map[string]string {
	client, broker, controller := l.ports[i][0], l.ports[i][1], l.ports[i][2]
	listeners := fmt.Sprintf("CLIENT://127.0.0.1:%d,BROKER://127.0.0.1:%d,CONTROLLER://127.0.0.1:%d", client, broker, controller)
	advertised := fmt.Sprintf("CLIENT://127.0.0.1:%d,BROKER://127.0.0.1:%d", client, broker)
	var voters []string
	for j := range l.nodes {
		voters = append(voters, fmt.Sprintf("%d@127.0.0.1:%d", j+1, l.ports[j][2]))
	}
	if !l.host {
		// Inside its own network namespace the node binds the container
		// ports; clients reach the client listener at the published port.
		listeners = "CLIENT://0.0.0.0:9092,BROKER://localhost:19092,CONTROLLER://localhost:19093"
		advertised = fmt.Sprintf("CLIENT://%s,BROKER://localhost:19092", net.JoinHostPort(l.daemonHost, strconv.Itoa(client)))
		voters = []string{"1@localhost:19093"}
	}
	rf, minISR, internalPartitions, heap := 1, 1, 1, "-Xms512m -Xmx512m"
	if l.nodes > 1 {
		// A cluster runs Kafka's defaults where they matter, as
		// production does: 50 partitions for the offsets and
		// transaction-state topics (where a group or a transactional id
		// lives then depends on its hash, as it does there).
		rf = min(l.nodes, 3)
		minISR, internalPartitions, heap = rf-1, 50, "-Xms384m -Xmx384m"
	}
	return map[string]string{
		"CLUSTER_ID":                                             l.clusterID,
		"KAFKA_NODE_ID":                                          strconv.Itoa(i + 1),
		"KAFKA_PROCESS_ROLES":                                    "broker,controller",
		"KAFKA_LISTENERS":                                        listeners,
		"KAFKA_ADVERTISED_LISTENERS":                             advertised,
		"KAFKA_LISTENER_SECURITY_PROTOCOL_MAP":                   "CLIENT:PLAINTEXT,BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT",
		"KAFKA_INTER_BROKER_LISTENER_NAME":                       "BROKER",
		"KAFKA_CONTROLLER_LISTENER_NAMES":                        "CONTROLLER",
		"KAFKA_CONTROLLER_QUORUM_VOTERS":                         strings.Join(voters, ","),
		"KAFKA_LOG_DIRS":                                         "/var/lib/kafka/data",
		"KAFKA_NUM_PARTITIONS":                                   "1",
		"KAFKA_AUTO_CREATE_TOPICS_ENABLE":                        "false",
		"KAFKA_DEFAULT_REPLICATION_FACTOR":                       strconv.Itoa(rf),
		"KAFKA_MIN_INSYNC_REPLICAS":                              strconv.Itoa(minISR),
		"KAFKA_UNCLEAN_LEADER_ELECTION_ENABLE":                   "false",
		"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR":                 strconv.Itoa(rf),
		"KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS":                     strconv.Itoa(internalPartitions),
		"KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR":         strconv.Itoa(rf),
		"KAFKA_TRANSACTION_STATE_LOG_MIN_ISR":                    strconv.Itoa(minISR),
		"KAFKA_TRANSACTION_STATE_LOG_NUM_PARTITIONS":             strconv.Itoa(internalPartitions),
		"KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": strconv.Itoa(rf),
		"KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR":            strconv.Itoa(minISR),
		// Tests start groups constantly, and zombie tests use short
		// session timeouts.
		"KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
		"KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS":     "1000",
		"KAFKA_HEAP_OPTS":                        heap,
	}
}

func (l *kafkaLayout) customize(i int, volume string, cfg kafkaConfig) []testcontainers.ContainerCustomizer {
	opts := append(cfg.customizers(),
		testcontainers.WithLabels(map[string]string{Label + ".node": strconv.Itoa(i + 1)}),
		testcontainers.WithEnv(l.env(i)),
		testcontainers.WithMounts(testcontainers.VolumeMount(volume, "/var/lib/kafka/data")),
	)
	// The volume carries the containers' label, so that what a killed
	// test binary left can be found.
	labelVolumes := func(hc *container.HostConfig) {
		for i := range hc.Mounts {
			if v := hc.Mounts[i].VolumeOptions; v != nil {
				if v.Labels == nil {
					v.Labels = map[string]string{}
				}
				maps.Copy(v.Labels, cfg.labels)
			}
		}
	}
	if l.host {
		return append(opts,
			testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
				labelVolumes(hc)
				hc.NetworkMode = "host"
			}),
			// On the host's network a container joins no other: not the
			// network testcontainers adds when the engine has no bridge.
			testcontainers.WithEndpointSettingsModifier(func(m map[string]*network.EndpointSettings) { clear(m) }))
	}
	// On a loopback Docker host the port is published on loopback only.
	return append(opts,
		testcontainers.WithHostConfigModifier(labelVolumes),
		publish("9092/tcp", l.daemonHost, strconv.Itoa(l.ports[i][0])))
}

// waitWhole returns once every node is a broker and every replica is in
// sync, or with the last thing missing when ctx ends (or 3 minutes have
// passed). A node just killed
// is still listed, and its replicas still in sync, until the cluster
// notices: so a restarted node (restarted > 0) must also answer Metadata
// itself and list itself in it.
func (k *KafkaContainer) waitWhole(ctx context.Context, restarted int) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var self *kadm.Client // the restarted node alone
	if restarted > 0 {
		selfCl, err := kgo.NewClient(kgo.SeedBrokers(k.brokers[restarted-1]))
		if err != nil {
			return err
		}
		defer selfCl.Close()
		self = kadm.NewClient(selfCl)
	}
	for {
		if err := k.running(ctx); err != nil {
			return err
		}
		err := whole(ctx, adm, len(k.nodes))
		if err == nil && self != nil {
			err = listsItself(ctx, self, restarted)
		}
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			var logs strings.Builder
			for i, node := range k.nodes {
				tail, _ := lastLines(context.Background(), node.ctr, 15)
				fmt.Fprintf(&logs, "\nnode %d's last lines:\n%s", i+1, tail)
			}
			return fmt.Errorf("the cluster was not whole in time: %w%s", err, logs.String())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// running returns an error naming the first node whose container is not
// running, with its last lines: a node that exited will not come back by
// waiting.
func (k *KafkaContainer) running(ctx context.Context) error {
	for i, node := range k.nodes {
		if node.ctr == nil {
			return fmt.Errorf("node %d has no container", i+1)
		}
		st, err := node.ctr.State(ctx)
		if err != nil {
			return fmt.Errorf("node %d: %w", i+1, err)
		}
		if !st.Running {
			logs, _ := lastLines(ctx, node.ctr, 30)
			return fmt.Errorf("node %d's container is %s (exit code %d); its last lines:\n%s", i+1, st.Status, st.ExitCode, logs)
		}
	}
	return nil
}

// listsItself returns nil once the node that adm reaches (and only it)
// answers Metadata listing itself as broker id.
func listsItself(ctx context.Context, adm *kadm.Client, id int) error {
	reqCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	md, err := adm.BrokerMetadata(reqCtx)
	if err != nil {
		return fmt.Errorf("node %d: %w", id, err)
	}
	for _, b := range md.Brokers {
		if int(b.NodeID) == id {
			return nil
		}
	}
	return fmt.Errorf("node %d does not list itself yet", id)
}

func whole(ctx context.Context, adm *kadm.Client, nodes int) error {
	reqCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	md, err := adm.Metadata(reqCtx)
	if err != nil {
		return err
	}
	if len(md.Brokers) < nodes {
		return fmt.Errorf("%d of %d nodes are brokers", len(md.Brokers), nodes)
	}
	for _, t := range md.Topics.Sorted() {
		if t.Err != nil {
			return fmt.Errorf("%s: %w", t.Topic, t.Err)
		}
		for _, p := range t.Partitions.Sorted() {
			if p.Err != nil {
				return fmt.Errorf("%s[%d]: %w", t.Topic, p.Partition, p.Err)
			}
			if len(p.ISR) < len(p.Replicas) {
				return fmt.Errorf("%s[%d] has %d of %d replicas in sync", t.Topic, p.Partition, len(p.ISR), len(p.Replicas))
			}
		}
	}
	return nil
}

// lastLines returns the last max lines of ctr's output.
func lastLines(ctx context.Context, ctr testcontainers.Container, max int) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rc, err := ctr.Logs(ctx)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return "", err
	}
	return tail(string(b), max), nil
}
