package pebblestore_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/eoskit/eoskit/state"
	"github.com/eoskit/eoskit/state/pebblestore"
)

// TestMain runs the child of TestACheckpointSurvivesAKill when asked to:
// it applies PEBBLE_APPLIES transactions, each with its checkpoint,
// says so on stdout, then applies one a millisecond (PEBBLE_KEEP_APPLYING)
// or nothing, until it is killed.
func TestMain(m *testing.M) {
	if dir := os.Getenv("PEBBLE_KILL_CHILD"); dir != "" {
		os.Exit(killChild(dir))
	}
	os.Exit(m.Run())
}

func killChild(dir string) int {
	every, err := time.ParseDuration(os.Getenv("PEBBLE_SYNC_EVERY"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	applies, err := strconv.Atoi(os.Getenv("PEBBLE_APPLIES"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	s, err := pebblestore.Open(dir, nil, pebblestore.SyncEvery(every))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	for i := 1; ; i++ {
		ws := []state.Write{{Key: fmt.Appendf(nil, "k%06d", i%5000), Value: fmt.Appendf(nil, "v%d", i)}}
		if err := s.Apply(ws, state.Checkpoint{TopicID: topicA, Offset: int64(i)}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		if i == applies {
			fmt.Println("applied")
			if os.Getenv("PEBBLE_KEEP_APPLYING") == "" {
				select {}
			}
		}
		if i > applies {
			time.Sleep(30 * time.Millisecond) // a few bytes a second: no block of pebble's log fills
		}
	}
}

// A process SIGKILLed after applying its transactions leaves a checkpoint
// a restart restores from: every transaction's under SyncEvery(0) (500,
// an fsync each); under the default, the child goes on applying a
// transaction every 30 ms for 1.5 s after the 20,000th (too few bytes to
// fill a block of pebble's log), and the store's syncing goroutine must
// have made one of them durable. Never synced, pebble may keep such
// batches in its own buffer, and a kill loses them (which made a
// SIGKILLed processor restore its partitions from 0, issue 46): not
// asserted here, since pebble's flusher may also write a partial block;
// eos's TestPebbleRestoresOnlyTheTailAfterASIGKILL fails with the sync
// turned off.
func TestACheckpointSurvivesAKill(t *testing.T) {
	for _, c := range []struct {
		name      string
		every     time.Duration
		applies   int64
		keepGoing bool
		check     func(offset, applies int64) bool
		want      string
	}{
		{"every apply", 0, 500, false, func(o, n int64) bool { return o == n }, "the last transaction's"},
		{"default", pebblestore.DefaultSyncEvery, 20_000, true, func(o, n int64) bool { return o > n }, "past the 20,000th"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "PEBBLE_KILL_CHILD="+dir, "PEBBLE_SYNC_EVERY="+c.every.String(),
				"PEBBLE_APPLIES="+strconv.FormatInt(c.applies, 10))
			if c.keepGoing {
				cmd.Env = append(cmd.Env, "PEBBLE_KEEP_APPLYING=1")
			}
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			said := make(chan bool, 1)
			go func() { said <- bufio.NewScanner(out).Scan() }()
			select {
			case ok := <-said:
				if !ok {
					t.Fatal("the child ended before it applied its transactions")
				}
			case <-time.After(time.Minute):
				t.Fatal("the child did not apply its transactions within a minute")
			}
			if c.keepGoing {
				time.Sleep(1500 * time.Millisecond)
			}
			_ = cmd.Process.Signal(syscall.SIGKILL)
			_ = cmd.Wait()
			s, err := pebblestore.Open(dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if o := s.Checkpoint().Offset; !c.check(o, c.applies) {
				t.Fatalf("checkpoint %d after the kill, want %s", o, c.want)
			}
		})
	}
}

// pebble without its log leaves nothing to sync, and a kill loses every
// batch since the last memtable flush: refused unless the caller gives up
// the sync.
func TestDisableWALIsRefusedUnlessTheSyncIsGivenUp(t *testing.T) {
	if s, err := pebblestore.Open(t.TempDir(), &pebble.Options{DisableWAL: true}); err == nil {
		s.Close()
		t.Fatal("a store without its log opened with the sync on")
	}
	s, err := pebblestore.Open(t.TempDir(), &pebble.Options{DisableWAL: true}, pebblestore.SyncEvery(-1))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}
