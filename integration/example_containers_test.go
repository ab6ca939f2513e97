package integration_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/eoskit/eoskit/integration"
)

// One broker container for every test of a package: start it in TestMain
// (the function below would be TestMain(m *testing.M)), export its address
// for integration.Kafka, and terminate it after the tests. integration.Kafka then
// finds KAFKA_BROKERS set and starts nothing per test.
func ExampleRunKafka() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	k, err := integration.RunKafka(ctx) // on an error nothing is left running
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "no broker:", err)
		os.Exit(1)
	}
	os.Setenv(integration.KafkaBrokersEnv, strings.Join(k.Brokers(), ","))
	code := 0 // code := m.Run()
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	_ = k.Terminate(ctx)
	cancel()
	os.Exit(code)
}

// A three-node cluster whose node 2 is stopped and started again mid-test,
// its data kept on its volume (host network: EOSKIT_DOCKER_NETWORK=host).
func ExampleKafkaContainer_Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	k, err := integration.RunKafka(ctx, integration.WithNodes(3), integration.WithHostNetwork(true))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer k.Terminate(context.Background())
	// ... start the code under test on k.Brokers() ...
	if err := k.Stop(ctx, 2, time.Minute); err != nil { // SIGTERM; SIGKILL after a minute
		fmt.Println(err)
		return
	}
	if err := k.Start(ctx, 2); err != nil { // back once every replica is in sync
		fmt.Println(err)
	}
}
