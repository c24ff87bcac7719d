// kvclient: a workload that records a history. Concurrent client processes
// do random gets and puts (and, if asked, cas and delete) on a few keys,
// each through a random member, and print one line per invocation and per
// completion on stdout in detvisor's history format:
//
//	{"detvisor_history":{"process":3,"op":17,"type":"invoke","f":"put","key":"k2","value":"p3-17","time_ns":123456789}}
//
// time_ns is CLOCK_MONOTONIC (under detvisor, the VMM's virtual clock).
// Stdout carries history lines only; diagnostics go to stderr.
//
// Completions: a 2xx answer is "ok" with its output. A definite refusal
// ("not leader" 503 from raftkv, connection refused) is "fail". Anything else
// (timeout, reset, a server error after the request was sent) is "info" for a
// write (it may have taken effect) and "fail" for a get (a read changes
// nothing, so it never took effect). After an "info" the process retires and
// its goroutine goes on as a new process (id + N), as in Jepsen, so that every
// process has at most one operation outstanding.
//
// Targets: raft (examples/raft/raftkv's HTTP API) and etcd (etcd 3.4's JSON
// gRPC gateway, /v3/kv/range with "serializable" per --consistency).
package main

import (
	"bytes"
	crand "crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// monotonicNs is CLOCK_MONOTONIC in nanoseconds (time.Now hides its
// monotonic reading).
func monotonicNs() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		log.Fatalf("kvclient: clock_gettime: %v", err)
	}
	return ts.Nano()
}

// event is the inner object of one history line (field order as documented).
type event struct {
	Process uint64      `json:"process"`
	Op      uint64      `json:"op"`
	Type    string      `json:"type"`
	F       string      `json:"f"`
	Key     string      `json:"key"`
	Value   interface{} `json:"value"`
	TimeNs  int64       `json:"time_ns"`
}

// history prints lines one at a time, stamped under its lock so that the
// lines are in time order.
type history struct {
	mu  sync.Mutex
	out io.Writer
}

func (h *history) record(e event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e.TimeNs = monotonicNs()
	line, err := json.Marshal(map[string]event{"detvisor_history": e})
	if err != nil {
		log.Fatalf("kvclient: %v", err)
	}
	line = append(line, '\n')
	if _, err := h.out.Write(line); err != nil {
		log.Fatalf("kvclient: writing the history: %v", err)
	}
}

// outcome of one request.
type outcome int

const (
	ok outcome = iota
	fail
	unknown
)

// result is what a request returned: its outcome and, when ok, its output
// (get: string or nil; cas: bool; put/delete: nil).
type result struct {
	outcome outcome
	output  interface{}
	why     string
}

// target speaks one system's API.
type target interface {
	get(c *http.Client, member, key string) result
	put(c *http.Client, member, key, value string) result
	cas(c *http.Client, member, key, from, to string) result
	del(c *http.Client, member, key string) result
}

// classify maps a transport error: refused before sending is a definite
// failure; anything else is unknown.
func classify(err error) result {
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETUNREACH) {
		return result{outcome: fail, why: err.Error()}
	}
	return result{outcome: unknown, why: err.Error()}
}

// --- raftkv ------------------------------------------------------------------

type raftTarget struct{}

func raftCall(c *http.Client, method, member, path string, q url.Values) (map[string]interface{}, result) {
	req, err := http.NewRequest(method, "http://"+member+path+"?"+q.Encode(), nil)
	if err != nil {
		return nil, result{outcome: fail, why: err.Error()}
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, classify(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, classify(err)
	}
	switch {
	case resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusBadRequest:
		return nil, result{outcome: fail, why: fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body)))}
	case resp.StatusCode/100 != 2:
		return nil, result{outcome: unknown, why: fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body)))}
	}
	var answer map[string]interface{}
	if err := json.Unmarshal(body, &answer); err != nil {
		return nil, result{outcome: unknown, why: fmt.Sprintf("bad answer %q: %v", body, err)}
	}
	return answer, result{outcome: ok}
}

func (raftTarget) get(c *http.Client, member, key string) result {
	answer, r := raftCall(c, http.MethodGet, member, "/get", url.Values{"key": {key}})
	if r.outcome == ok {
		if found, _ := answer["found"].(bool); found {
			r.output = answer["value"]
		}
	}
	return r
}

func (raftTarget) put(c *http.Client, member, key, value string) result {
	_, r := raftCall(c, http.MethodPost, member, "/put", url.Values{"key": {key}, "value": {value}})
	return r
}

func (raftTarget) cas(c *http.Client, member, key, from, to string) result {
	answer, r := raftCall(c, http.MethodPost, member, "/cas", url.Values{"key": {key}, "from": {from}, "to": {to}})
	if r.outcome == ok {
		swapped, isBool := answer["swapped"].(bool)
		if !isBool {
			return result{outcome: unknown, why: fmt.Sprintf("cas answer without swapped: %v", answer)}
		}
		r.output = swapped
	}
	return r
}

func (raftTarget) del(c *http.Client, member, key string) result {
	_, r := raftCall(c, http.MethodPost, member, "/delete", url.Values{"key": {key}})
	return r
}

// --- etcd 3.4 JSON gateway -----------------------------------------------------

type etcdTarget struct{ serializable bool }

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func etcdCall(c *http.Client, member, path string, request interface{}) (map[string]interface{}, result) {
	body, err := json.Marshal(request)
	if err != nil {
		return nil, result{outcome: fail, why: err.Error()}
	}
	resp, err := c.Post("http://"+member+path, "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, classify(err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, classify(err)
	}
	if resp.StatusCode/100 != 2 {
		// gRPC errors through the gateway: a write may still commit.
		return nil, result{outcome: unknown, why: fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(answer)))}
	}
	var decoded map[string]interface{}
	if err := json.Unmarshal(answer, &decoded); err != nil {
		return nil, result{outcome: unknown, why: fmt.Sprintf("bad answer %q: %v", answer, err)}
	}
	if e, has := decoded["error"]; has {
		return nil, result{outcome: unknown, why: fmt.Sprint(e)}
	}
	return decoded, result{outcome: ok}
}

func (t etcdTarget) get(c *http.Client, member, key string) result {
	answer, r := etcdCall(c, member, "/v3/kv/range", map[string]interface{}{"key": b64(key), "serializable": t.serializable})
	if r.outcome != ok {
		return r
	}
	kvs, _ := answer["kvs"].([]interface{})
	if len(kvs) == 0 {
		return r
	}
	kv, _ := kvs[0].(map[string]interface{})
	encoded, _ := kv["value"].(string) // absent when the value is empty
	value, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil {
		return result{outcome: fail, why: fmt.Sprintf("value %q: %v", encoded, err)}
	}
	r.output = string(value)
	return r
}

func (etcdTarget) put(c *http.Client, member, key, value string) result {
	_, r := etcdCall(c, member, "/v3/kv/put", map[string]interface{}{"key": b64(key), "value": b64(value)})
	return r
}

func (etcdTarget) cas(c *http.Client, member, key, from, to string) result {
	answer, r := etcdCall(c, member, "/v3/kv/txn", map[string]interface{}{
		"compare": []interface{}{map[string]interface{}{
			"key": b64(key), "target": "VALUE", "result": "EQUAL", "value": b64(from),
		}},
		"success": []interface{}{map[string]interface{}{
			"requestPut": map[string]interface{}{"key": b64(key), "value": b64(to)},
		}},
	})
	if r.outcome == ok {
		swapped, _ := answer["succeeded"].(bool) // absent when false
		r.output = swapped
	}
	return r
}

func (etcdTarget) del(c *http.Client, member, key string) result {
	_, r := etcdCall(c, member, "/v3/kv/deleterange", map[string]interface{}{"key": b64(key)})
	return r
}

// --- the workload ------------------------------------------------------------

type config struct {
	target    target
	members   []string
	keys      []string
	ops       []string
	processes int
	duration  time.Duration
	timeout   time.Duration
	pauseMin  time.Duration
	pauseMax  time.Duration
}

func newClient(timeout time.Duration) *http.Client {
	// One transport per process: no connection is shared between processes.
	return &http.Client{Timeout: timeout, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
}

// run is one goroutine: process ids slot, slot+N, slot+2N, ... (a new one
// after every "info").
func run(cfg *config, h *history, slot int, seed int64, deadline int64, wg *sync.WaitGroup) {
	defer wg.Done()
	rng := rand.New(rand.NewSource(seed))
	process := uint64(slot)
	client := newClient(cfg.timeout)
	var op uint64
	// The last value this goroutine read or wrote per key: cas compares
	// against it, so that some cas operations succeed.
	seen := map[string]string{}
	for monotonicNs() < deadline {
		op++
		f := cfg.ops[rng.Intn(len(cfg.ops))]
		key := cfg.keys[rng.Intn(len(cfg.keys))]
		member := cfg.members[rng.Intn(len(cfg.members))]
		var invokeValue interface{}
		var r result
		switch f {
		case "get":
			h.record(event{Process: process, Op: op, Type: "invoke", F: f, Key: key})
			r = cfg.target.get(client, member, key)
		case "put":
			value := fmt.Sprintf("p%d-%d", process, op)
			invokeValue = value
			h.record(event{Process: process, Op: op, Type: "invoke", F: f, Key: key, Value: value})
			r = cfg.target.put(client, member, key, value)
		case "cas":
			// From the value last seen on the key; to a new unique value.
			from, known := seen[key]
			if !known {
				from = fmt.Sprintf("p%d-%d", rng.Intn(cfg.processes), 1+rng.Intn(int(op)))
			}
			to := fmt.Sprintf("c%d-%d", process, op)
			invokeValue = []string{from, to}
			h.record(event{Process: process, Op: op, Type: "invoke", F: f, Key: key, Value: invokeValue})
			r = cfg.target.cas(client, member, key, from, to)
		case "delete":
			h.record(event{Process: process, Op: op, Type: "invoke", F: f, Key: key})
			r = cfg.target.del(client, member, key)
		}
		if r.outcome == ok {
			switch f {
			case "get":
				if v, isString := r.output.(string); isString {
					seen[key] = v
				}
			case "put":
				seen[key] = invokeValue.(string)
			case "cas":
				if r.output == true {
					seen[key] = invokeValue.([]string)[1]
				}
			}
		}
		if f == "get" && r.outcome == unknown {
			r.outcome = fail // a read changes nothing
		}
		done := event{Process: process, Op: op, F: f, Key: key}
		switch r.outcome {
		case ok:
			done.Type, done.Value = "ok", r.output
		case fail:
			done.Type = "fail"
		case unknown:
			done.Type = "info"
		}
		h.record(done)
		if r.outcome != ok {
			log.Printf("kvclient: process %d op %d %s %s via %s: %s: %s",
				process, op, f, key, member, done.Type, r.why)
		}
		if r.outcome == unknown {
			process += uint64(cfg.processes)
			op = 0
			client = newClient(cfg.timeout)
		}
		pause := cfg.pauseMin
		if cfg.pauseMax > cfg.pauseMin {
			pause += time.Duration(rng.Int63n(int64(cfg.pauseMax - cfg.pauseMin)))
		}
		time.Sleep(pause)
	}
}

// waitReady writes a probe key through each member in turn until one accepts
// it (the history does not show these writes: the probe key is not one of
// the workload's keys).
func waitReady(cfg *config, limit time.Duration) error {
	client := newClient(cfg.timeout)
	deadline := monotonicNs() + limit.Nanoseconds()
	for attempt := 0; monotonicNs() < deadline; attempt++ {
		member := cfg.members[attempt%len(cfg.members)]
		r := cfg.target.put(client, member, "kvclient-ready", "1")
		if r.outcome == ok {
			log.Printf("kvclient: ready (a write through %s succeeded)", member)
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("no member accepted a write within %v", limit)
}

// announceSetup tells an Antithesis-style harness that setup is complete, if
// it asked for SDK output (the file named by ANTITHESIS_SDK_LOCAL_OUTPUT).
func announceSetup() {
	path := os.Getenv("ANTITHESIS_SDK_LOCAL_OUTPUT")
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		log.Printf("kvclient: %s: %v", path, err)
		return
	}
	defer f.Close()
	_, _ = f.WriteString(`{"antithesis_setup":{"status":"complete","details":null}}` + "\n")
}

// parsePause parses "50ms" or "20ms..100ms".
func parsePause(text string) (time.Duration, time.Duration, error) {
	lo, hi := text, text
	if i := strings.Index(text, ".."); i >= 0 {
		lo, hi = text[:i], text[i+2:]
	}
	min, err := time.ParseDuration(lo)
	if err != nil {
		return 0, 0, err
	}
	max, err := time.ParseDuration(hi)
	if err != nil {
		return 0, 0, err
	}
	if max < min || min < 0 {
		return 0, 0, fmt.Errorf("%q: expected MIN..MAX with 0 <= MIN <= MAX", text)
	}
	return min, max, nil
}

func main() {
	log.SetFlags(0)
	targetName := flag.String("target", "raft", "raft (raftkv's HTTP API) or etcd (etcd 3.4's JSON gateway)")
	endpoints := flag.String("endpoints", "", "members, HOST:PORT,... (required)")
	consistency := flag.String("consistency", "l", "etcd reads: s (serializable) or l (linearizable)")
	processes := flag.Int("processes", 5, "concurrent client processes")
	keyCount := flag.Int("keys", 3, "number of keys (k1..kN)")
	opsText := flag.String("ops", "get,put", "operations to draw from: get,put,cas,delete (repeat one to weight it)")
	duration := flag.Duration("duration", 20*time.Second, "how long to issue operations")
	timeout := flag.Duration("timeout", 1*time.Second, "per-request timeout")
	pauseText := flag.String("pause-between", "20ms..100ms", "pause after each operation, D or MIN..MAX")
	seed := flag.Int64("seed", 0, "random seed (0: from the system's random source)")
	ready := flag.Duration("wait-ready", 60*time.Second, "first wait until a write succeeds, at most this long (0: do not wait)")
	flag.Parse()

	cfg := &config{processes: *processes, duration: *duration, timeout: *timeout}
	switch *targetName {
	case "raft":
		cfg.target = raftTarget{}
	case "etcd":
		switch *consistency {
		case "s":
			cfg.target = etcdTarget{serializable: true}
		case "l":
			cfg.target = etcdTarget{serializable: false}
		default:
			log.Fatalf("kvclient: --consistency %q: expected s or l", *consistency)
		}
	default:
		log.Fatalf("kvclient: --target %q: expected raft or etcd", *targetName)
	}
	for _, m := range strings.Split(*endpoints, ",") {
		if m = strings.TrimSpace(m); m != "" {
			cfg.members = append(cfg.members, m)
		}
	}
	if len(cfg.members) == 0 {
		log.Fatalf("kvclient: --endpoints: no members given")
	}
	if *processes < 1 || *keyCount < 1 {
		log.Fatalf("kvclient: --processes and --keys must be at least 1")
	}
	for i := 1; i <= *keyCount; i++ {
		cfg.keys = append(cfg.keys, fmt.Sprintf("k%d", i))
	}
	for _, f := range strings.Split(*opsText, ",") {
		switch f {
		case "get", "put", "cas", "delete":
			cfg.ops = append(cfg.ops, f)
		default:
			log.Fatalf("kvclient: --ops: unknown operation %q (get, put, cas, delete)", f)
		}
	}
	var err error
	if cfg.pauseMin, cfg.pauseMax, err = parsePause(*pauseText); err != nil {
		log.Fatalf("kvclient: --pause-between: %v", err)
	}
	if *seed == 0 {
		var b [8]byte
		if _, err := crand.Read(b[:]); err != nil {
			log.Fatalf("kvclient: random seed: %v", err)
		}
		*seed = int64(binary.LittleEndian.Uint64(b[:]) >> 1)
	}
	log.Printf("kvclient: target %s, members %v, %d processes, keys %v, ops %v, seed %d",
		*targetName, cfg.members, cfg.processes, cfg.keys, cfg.ops, *seed)

	if *ready > 0 {
		if err := waitReady(cfg, *ready); err != nil {
			log.Fatalf("kvclient: %v", err)
		}
	}
	announceSetup()

	h := &history{out: os.Stdout}
	deadline := monotonicNs() + cfg.duration.Nanoseconds()
	var wg sync.WaitGroup
	for slot := 0; slot < cfg.processes; slot++ {
		wg.Add(1)
		go run(cfg, h, slot, *seed+int64(slot)*7919, deadline, &wg)
	}
	wg.Wait()
	log.Printf("kvclient: done")
}
