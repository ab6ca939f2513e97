package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/patterns/dashboard"
	"github.com/eoskit/eoskit/verify"
	"github.com/eoskit/eoskit/window"
)

func TestMain(m *testing.M) {
	integration.RunChild(map[string]integration.ChildFunc{"web": func(ctx context.Context, args []string) error {
		var cfg Config
		if err := cfg.parse(flag.NewFlagSet("web", flag.ContinueOnError), args); err != nil {
			return err
		}
		// The test's listening socket, its port held across restarts
		// (startWeb).
		l, err := net.FileListener(os.NewFile(3, "http"))
		if err != nil {
			return fmt.Errorf("the test's listener (descriptor 3): %w", err)
		}
		cfg.Listener = l
		// A short session, so that a member killed for good leaves the
		// group within seconds.
		cfg.Options = []eos.ProcessorOption{eos.CommitInterval(100 * time.Millisecond),
			eos.ClientOptions(kgo.SessionTimeout(6*time.Second), kgo.RebalanceTimeout(10*time.Second))}
		return run(ctx, cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	}})
	os.Exit(m.Run())
}

// shown is what the page shows, read from its DOM.
type shown struct {
	State  string           `json:"state"`
	Hidden bool             `json:"hidden"`
	Totals map[string]int64 `json:"totals"`
	Days   map[string]int64 `json:"days"` // "region|YYYY-MM-DD"
}

const readPage = `(() => ({
	state: document.getElementById("status").dataset.state,
	hidden: document.getElementById("numbers").hidden,
	totals: Object.fromEntries([...document.querySelectorAll("#totals tbody tr")].map(tr =>
		[tr.dataset.region, Number(tr.querySelector(".total").textContent)])),
	days: Object.fromEntries([...document.querySelectorAll("#days tbody td[data-day]")].filter(td => td.textContent !== "").map(td =>
		[td.parentElement.dataset.region + "|" + td.dataset.day, Number(td.textContent)])),
}))()`

// The dashboard's page, in a real headless Chromium, on two instances of
// the program on a real broker: case reports (keyed by region, with out
// of order report times, some late past a day's grace, some that do not
// parse) come from a transactional producer that aborts every other
// transaction, over six partitions, while one instance is SIGKILLed
// mid-stream, left dead until the group gives its partitions to the
// other, and started again (taking some back). The page is read from the
// other instance all along (a load balancer's pick): while the killed
// instance's partitions cannot be answered the page says it waits for
// them and shows no numbers (never partial totals: a region once shown
// never disappears or goes down); at the end, the totals and the per-day counts
// on the page, from either instance, equal what the committed reports
// give (the verifier's rules for days, written apart from eos's).
func TestThePageShowsTheExactTotalsThroughAKill(t *testing.T) {
	k := integration.Kafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const partitions = 6
	reports := k.NewTopic(partitions)
	compact := "compact"
	names := map[string]string{"-reports": reports}
	for _, s := range []string{"-totals", "-days", "-totals-changelog", "-days-changelog"} {
		names[s] = integration.UniqueName(t, "web"+s)
		var cfg map[string]*string
		if strings.HasSuffix(s, "changelog") {
			cfg = map[string]*string{"cleanup.policy": &compact}
		}
		k.CreateTopic(names[s], partitions, cfg)
	}
	names["-dead-letters"] = integration.UniqueName(t, "web-dead-letters")
	k.CreateTopic(names["-dead-letters"], 1, nil)
	group := integration.UniqueName(t, "web")

	type instance struct {
		name, url string
		args      []string
		child     *integration.Child
	}
	newInstance := func(name string) *instance {
		l := listen(t, "127.0.0.1:0")
		addr := l.Addr().String()
		in := &instance{name: name, url: "http://" + addr,
			args: []string{"-brokers", strings.Join(k.Brokers, ","), "-group", group, "-instance", name, "-http", addr, "-endpoint", "http://" + addr}}
		for flag, topic := range names {
			in.args = append(in.args, flag, topic)
		}
		in.child = startWeb(t, l, in.args)
		return in
	}
	a, b := newInstance("web-a"), newInstance("web-b")

	page := browser(t, ctx)
	if _, err := chromedp.Run(page, chromedp.Navigate(a.url)); err != nil {
		t.Fatalf("open the page: %v", err)
	}
	read := func() shown {
		s, err := chromedp.Run(page, chromedp.Evaluate[shown](readPage))
		if err != nil {
			t.Fatalf("read the page: %v", err)
		}
		return s
	}
	// seen checks each reading against the ones before: numbers only
	// when every partition answered, and no region's or day's number
	// going down or gone.
	var states = map[string]int{}
	highest := map[string]int64{}
	seen := func(s shown) {
		states[s.State]++
		if s.State != "complete" {
			if !s.Hidden {
				t.Fatalf("the page shows its numbers while %s", s.State)
			}
			return
		}
		now := map[string]int64{}
		for r, n := range s.Totals {
			now["total "+r] = n
		}
		for d, n := range s.Days {
			now["day "+d] = n
		}
		for what, n := range highest {
			if now[what] < n {
				t.Fatalf("the page showed %s at %d, then at %d (partial or stale totals)", what, n, now[what])
			}
		}
		maps.Copy(highest, now)
	}
	var running []*instance // the instances that must not exit
	waitFor := func(what string, ok func(shown) bool) shown {
		for {
			for _, in := range running {
				select {
				case <-in.child.Done():
					t.Fatalf("%s exited while the page was awaited to show %s:\n%s", in.name, what, in.child.Output())
				default:
				}
			}
			s := read()
			seen(s)
			if ok(s) {
				return s
			}
			if ctx.Err() != nil {
				t.Fatalf("the page never showed %s; it shows %+v", what, s)
			}
			time.Sleep(150 * time.Millisecond)
		}
	}
	running = []*instance{a, b}
	waitFor("every partition answered", func(s shown) bool { return s.State == "complete" })

	// The reports: three and a half days of them, from 3 days ago at
	// midnight, each said reported up to two hours before its record
	// was written; every 97th no report at all.
	const n = 3000
	// Reports over the 84 hours before now (four days or five), none
	// stamped ahead of it: Kafka 4 refuses a record stamped more than an
	// hour ahead (log.message.timestamp.after.max.ms), and a base at a
	// midnight three days back put the last ones up to 12 h ahead, which
	// failed the seed in the first hours of every UTC day.
	step := 84 * time.Hour / n
	base := time.Now().UTC().Add(-84 * time.Hour)
	var produced atomic.Int64
	decorate := func(r *kgo.Record) {
		id := string(r.Key)
		i, _ := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
		r.Timestamp = base.Add(time.Duration(i) * step)
		rep := dashboard.Report{ID: id, Region: "region-" + strconv.Itoa(i%9), Cases: 1 + i%5,
			ReportedAt: r.Timestamp.Add(-time.Duration(i%9) * 15 * time.Minute)}
		r.Key, r.Value = []byte(rep.Region), rep.Value()
		if i%97 == 0 && strings.HasPrefix(id, "in-") {
			r.Value = []byte("no report " + id)
		}
		produced.Add(1)
	}
	seeded := make(chan error, 1)
	go func() {
		_, _, err := integration.SeedTransactional(ctx, k.Brokers, reports, n, 20, decorate)
		seeded <- err
	}()
	waitFor("a total", func(s shown) bool { return s.State == "complete" && len(s.Totals) > 0 })
	if produced.Load() >= 2*n {
		t.Fatal("the producer ended before the kill: make n larger")
	}
	if err := b.child.Kill(); err != nil {
		t.Fatal(err)
	}
	// Its port held from just after its death (requests to it wait,
	// then time out) to its restart.
	bListener := listen(t, strings.TrimPrefix(b.url, "http://"))
	running = []*instance{a}
	waitFor("that it waits for the killed instance's partitions", func(s shown) bool { return s.State == "incomplete" })
	// The group gives the killed instance's partitions to the other
	// (its session times out): the page is whole again from it alone.
	waitFor("every partition answered by the instance left", func(s shown) bool { return s.State == "complete" })
	b.child = startWeb(t, bListener, b.args)
	running = []*instance{a, b}
	if err := <-seeded; err != nil {
		t.Fatal(err)
	}

	truth := truthOf(t, ctx, k.Brokers, reports)
	equal := func(s shown) bool {
		return s.State == "complete" && maps.Equal(s.Totals, truth.totals) && maps.Equal(s.Days, truth.days)
	}
	final := waitFor("the truth", equal)
	t.Logf("the page: %d regions, %d region-days, %d cases; %d late reports left out; readings %v",
		len(final.Totals), len(final.Days), truth.cases, truth.late, states)
	if truth.late == 0 || len(truth.days) < 2*9 {
		t.Fatalf("the input has %d late reports and %d region-days: it tests no lateness or no days", truth.late, len(truth.days))
	}
	if path := os.Getenv("EOSKIT_DASHBOARD_SCREENSHOT"); path != "" {
		png, err := chromedp.Run(page, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The same page from the instance that was killed.
	if _, err := chromedp.Run(page, chromedp.Navigate(b.url)); err != nil {
		t.Fatal(err)
	}
	waitFor("the truth from the restarted instance", equal)
	for _, in := range []*instance{a, b} {
		if err := in.child.Stop(30 * time.Second); err != nil {
			t.Errorf("%s: %v", in.name, err)
		}
	}
}

type truth struct {
	totals      map[string]int64
	days        map[string]int64
	cases, late int64
}

// truthOf computes what the page must show from the committed reports.
func truthOf(t *testing.T, ctx context.Context, brokers []string, topic string) truth {
	recs, err := verify.ReadTopic(ctx, brokers, topic, kgo.ReadCommitted(), true, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	tr := truth{totals: map[string]int64{}, days: map[string]int64{}}
	of := func(r *kgo.Record) (time.Time, int64, bool) {
		at, err := dashboard.ReportedAt(r)
		if err != nil {
			return time.Time{}, 0, false
		}
		rep, _ := dashboard.Parse(r.Value)
		return at, int64(rep.Cases), true
	}
	for _, r := range recs {
		if _, cases, ok := of(r); ok {
			rep, _ := dashboard.Parse(r.Value)
			tr.totals[rep.Region] += cases
			tr.cases += cases
		}
	}
	wc := verify.SumWindows(recs, dashboard.Days.Size, dashboard.Days.Grace, dashboard.Days.Retention, of)
	for key, n := range wc.Counts {
		region, day, err := window.SplitKey([]byte(key))
		if err != nil {
			t.Fatal(err)
		}
		if !wc.Expired[key] {
			tr.days[fmt.Sprintf("%s|%s", region, day.UTC().Format(time.DateOnly))] = n
		}
	}
	tr.late = int64(wc.Late)
	return tr
}

// browser starts a headless Chromium (Debian's, which scripts/chromium.sh
// installs) and returns a tab of it, whose actions end with ctx.
func browser(t *testing.T, ctx context.Context) context.Context {
	t.Helper()
	path := os.Getenv("EOSKIT_CHROMIUM")
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if path != "" {
			break
		}
		path, _ = exec.LookPath(name)
	}
	if path == "" {
		integration.ServiceMissing(t, "Chromium", "Run scripts/chromium.sh install (Debian's chromium package), or set EOSKIT_CHROMIUM to a Chromium.",
			fmt.Errorf("no chromium, chromium-browser or google-chrome on the PATH"))
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.WindowSize(1000, 1000))
	alloc, cancel := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancel)
	tab, cancel := chromedp.NewContext(alloc)
	t.Cleanup(cancel)
	return tab
}

// listen listens on addr (a port of 0: any), for an instance to serve on.
func listen(t *testing.T, addr string) *net.TCPListener {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return l.(*net.TCPListener)
}

// startWeb starts an instance with args, serving on l, which it takes
// over: the port is never free between the test's choice and the
// instance's serving, where another process could take it.
func startWeb(t *testing.T, l *net.TCPListener, args []string) *integration.Child {
	t.Helper()
	f, err := l.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	defer l.Close() // the child holds the socket now
	return integration.StartChildFiles(t, "web", []*os.File{f}, args...)
}
