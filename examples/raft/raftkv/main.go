// raftkv: a small key-value service on hashicorp/raft (Debian's
// golang-github-hashicorp-raft-dev), one process per node, for detvisor's
// fault-injection examples (examples/raft/README.md).
//
// Writes (put, cas, delete) go through raft.Apply on the leader. Reads come
// from the local state machine, in one of two modes:
//
//   - default, a lease read without VerifyLeader (the bug under test): a
//     node serves reads while it holds a read lease. A background loop on the
//     leader confirms leadership with raft.VerifyLeader() every
//     --lease-renew and, when a quorum answered, extends the lease to the
//     round's start + --read-lease. A lease read is safe only if no other
//     leader can commit before the lease ends, i.e. if the lease is shorter
//     than the followers' election timeout; --read-lease (2 s, sized for
//     raft's default 1 s heartbeat timeout) is much longer than the tuned
//     --heartbeat (150 ms). A leader that is paused (or cut off) while the
//     others elect a new leader and commit writes serves stale reads from
//     its lease until the lease ends, after it resumes.
//   - --verify-leader: every read first calls raft.VerifyLeader(), which
//     contacts a quorum, and is refused when that fails; and a new leader
//     serves reads only after a raft.Barrier() (its state machine has
//     applied every entry of earlier terms). That is Raft's recipe for
//     linearizable reads (section 8: a read needs a leader that is not
//     deposed and knows which entries are committed).
//
// HTTP API (all answers are JSON, one object, newline-terminated):
//
//	GET  /get?key=k               200 {"found":true,"value":"v"} or {"found":false}
//	PUT|POST /put?key=k&value=v   200 {}
//	PUT|POST /cas?key=k&from=a&to=b  200 {"swapped":true|false}
//	PUT|POST /delete?key=k        200 {}
//	503 {"error":"not leader"}    refused before anything was proposed: a
//	                              definite failure
//	500 {"error":"..."}           proposed, outcome unknown (apply timed out,
//	                              leadership lost): an indefinite failure
//	400 {"error":"..."}           a bad request
//
// Leadership changes are logged on stderr as
// "raftkv <id>: leader=<true|false>".
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// command is one entry of the raft log.
type command struct {
	Op    string `json:"op"` // put | cas | delete
	Key   string `json:"key"`
	Value string `json:"value,omitempty"`
	From  string `json:"from,omitempty"`
	To    string `json:"to,omitempty"`
}

// store is the replicated state machine: a map of strings.
type store struct {
	mu   sync.Mutex
	data map[string]string
}

func (s *store) Apply(entry *raft.Log) interface{} {
	var c command
	if err := json.Unmarshal(entry.Data, &c); err != nil {
		return fmt.Errorf("bad command at index %d: %v", entry.Index, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch c.Op {
	case "put":
		s.data[c.Key] = c.Value
		return nil
	case "delete":
		delete(s.data, c.Key)
		return nil
	case "cas":
		if current, ok := s.data[c.Key]; ok && current == c.From {
			s.data[c.Key] = c.To
			return true
		}
		return false
	}
	return fmt.Errorf("unknown op %q at index %d", c.Op, entry.Index)
}

func (s *store) get(key string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.data[key]
	return v, ok
}

type snapshot struct{ data map[string]string }

func (s *store) Snapshot() (raft.FSMSnapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	copy := make(map[string]string, len(s.data))
	for k, v := range s.data {
		copy[k] = v
	}
	return &snapshot{data: copy}, nil
}

func (s *store) Restore(r io.ReadCloser) error {
	defer r.Close()
	data := map[string]string{}
	if err := json.NewDecoder(r).Decode(&data); err != nil {
		return err
	}
	s.mu.Lock()
	s.data = data
	s.mu.Unlock()
	return nil
}

func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	if err := json.NewEncoder(sink).Encode(s.data); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s *snapshot) Release() {}

type server struct {
	id           string
	raft         *raft.Raft
	fsm          *store
	verifyLeader bool
	applyTimeout time.Duration
	// believesLeader is what raft last said on LeaderCh (--verify-leader).
	believesLeader int32
	// leaseUntil is when the read lease ends, in CLOCK_MONOTONIC
	// nanoseconds of this process's clock (0: no lease).
	leaseUntil int64
	readLease  time.Duration
	renewEvery time.Duration
}

func reply(w http.ResponseWriter, status int, body interface{}) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

func refuse(w http.ResponseWriter, status int, err string) {
	reply(w, status, map[string]string{"error": err})
}

func (s *server) leads() bool { return atomic.LoadInt32(&s.believesLeader) == 1 }

// monotonic is the time since the process started (Go's monotonic clock).
var start = time.Now()

func monotonic() int64 { return int64(time.Since(start)) }

func (s *server) holdsLease() bool { return monotonic() < atomic.LoadInt64(&s.leaseUntil) }

// renewLease extends the read lease after each successful leadership check
// (the lease counts from the check's start: a quorum heard from us then).
func (s *server) renewLease() {
	held := false
	for {
		time.Sleep(s.renewEvery)
		if s.raft.State() != raft.Leader {
			continue
		}
		began := monotonic()
		if err := s.raft.VerifyLeader().Error(); err != nil {
			if held {
				log.Printf("raftkv %s: lease not renewed: %v", s.id, err)
				held = false
			}
			continue
		}
		atomic.StoreInt64(&s.leaseUntil, began+int64(s.readLease))
		if !held {
			log.Printf("raftkv %s: read lease held (renewed every %v, lasts %v)", s.id, s.renewEvery, s.readLease)
			held = true
		}
	}
}

func (s *server) watchLeadership() {
	for leader := range s.raft.LeaderCh() {
		if leader && s.verifyLeader {
			// A new leader's state machine may lag entries committed in
			// earlier terms (Raft section 8): wait until it has applied
			// everything in its log before serving reads.
			if err := s.raft.Barrier(s.applyTimeout).Error(); err != nil {
				log.Printf("raftkv %s: barrier after election: %v", s.id, err)
				continue
			}
		}
		v := int32(0)
		if leader {
			v = 1
		}
		atomic.StoreInt32(&s.believesLeader, v)
		log.Printf("raftkv %s: leader=%v", s.id, leader)
	}
}

func (s *server) handleGet(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("key")
	if key == "" {
		refuse(w, http.StatusBadRequest, "missing key")
		return
	}
	if s.verifyLeader {
		if !s.leads() {
			refuse(w, http.StatusServiceUnavailable, "not leader")
			return
		}
		if err := s.raft.VerifyLeader().Error(); err != nil {
			refuse(w, http.StatusServiceUnavailable, "not leader: "+err.Error())
			return
		}
	} else if !s.holdsLease() {
		refuse(w, http.StatusServiceUnavailable, "not leader (no read lease)")
		return
	}
	if v, ok := s.fsm.get(key); ok {
		reply(w, http.StatusOK, map[string]interface{}{"found": true, "value": v})
	} else {
		reply(w, http.StatusOK, map[string]interface{}{"found": false})
	}
}

// write proposes c and answers with what the state machine returned.
func (s *server) write(w http.ResponseWriter, r *http.Request, c command) {
	if r.Method != http.MethodPut && r.Method != http.MethodPost {
		refuse(w, http.StatusMethodNotAllowed, "use PUT or POST")
		return
	}
	if c.Key == "" {
		refuse(w, http.StatusBadRequest, "missing key")
		return
	}
	if s.raft.State() != raft.Leader {
		refuse(w, http.StatusServiceUnavailable, "not leader")
		return
	}
	data, err := json.Marshal(c)
	if err != nil {
		refuse(w, http.StatusInternalServerError, err.Error())
		return
	}
	future := s.raft.Apply(data, s.applyTimeout)
	if err := future.Error(); err != nil {
		// Proposed, maybe committed by a later leader: the outcome is unknown.
		refuse(w, http.StatusInternalServerError, "apply: "+err.Error())
		return
	}
	switch result := future.Response().(type) {
	case error:
		refuse(w, http.StatusBadRequest, result.Error())
	case bool:
		reply(w, http.StatusOK, map[string]bool{"swapped": result})
	default:
		reply(w, http.StatusOK, map[string]string{})
	}
}

func (s *server) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/get", s.handleGet)
	mux.HandleFunc("/put", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		s.write(w, r, command{Op: "put", Key: q.Get("key"), Value: q.Get("value")})
	})
	mux.HandleFunc("/cas", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		s.write(w, r, command{Op: "cas", Key: q.Get("key"), From: q.Get("from"), To: q.Get("to")})
	})
	mux.HandleFunc("/delete", func(w http.ResponseWriter, r *http.Request) {
		s.write(w, r, command{Op: "delete", Key: r.URL.Query().Get("key")})
	})
	mux.HandleFunc("/status", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK, map[string]interface{}{
			"id": s.id, "state": s.raft.State().String(), "leader": string(s.raft.Leader()),
			"believes_leader": s.leads(), "holds_lease": s.holdsLease(),
		})
	})
	return mux
}

// parsePeers parses "n1=192.0.2.1:7000,n2=...".
func parsePeers(text string) ([]raft.Server, error) {
	var servers []raft.Server
	for _, item := range strings.Split(text, ",") {
		parts := strings.SplitN(item, "=", 2)
		if len(parts) != 2 || parts[0] == "" || parts[1] == "" {
			return nil, fmt.Errorf("peer %q: expected ID=HOST:PORT", item)
		}
		if _, _, err := net.SplitHostPort(parts[1]); err != nil {
			return nil, fmt.Errorf("peer %q: %v", item, err)
		}
		servers = append(servers, raft.Server{
			Suffrage: raft.Voter, ID: raft.ServerID(parts[0]), Address: raft.ServerAddress(parts[1]),
		})
	}
	return servers, nil
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("")
	id := flag.String("id", "", "this node's raft server ID (must be one of --peers)")
	raftBind := flag.String("raft", "", "raft TCP address to listen on and advertise (HOST:PORT); default: this node's address in --peers")
	httpBind := flag.String("http", ":8000", "HTTP API address")
	peers := flag.String("peers", "", "every voter, ID=HOST:PORT,... (static bootstrap)")
	verify := flag.Bool("verify-leader", false, "call raft.VerifyLeader() before serving a read (instead of lease reads)")
	readLease := flag.Duration("read-lease", 2*time.Second, "without --verify-leader: how long a leadership check lets the node serve reads")
	renewEvery := flag.Duration("lease-renew", 100*time.Millisecond, "without --verify-leader: how often the leader renews its read lease")
	heartbeat := flag.Duration("heartbeat", 150*time.Millisecond, "raft HeartbeatTimeout")
	election := flag.Duration("election", 300*time.Millisecond, "raft ElectionTimeout")
	lease := flag.Duration("lease", 100*time.Millisecond, "raft LeaderLeaseTimeout (<= heartbeat)")
	commit := flag.Duration("commit", 25*time.Millisecond, "raft CommitTimeout")
	applyTimeout := flag.Duration("apply-timeout", 2*time.Second, "how long a write waits to be enqueued")
	raftLog := flag.String("raft-log", "WARN", "hashicorp/raft log level (TRACE..ERROR, OFF)")
	flag.Parse()

	servers, err := parsePeers(*peers)
	if err != nil {
		log.Fatalf("raftkv: --peers: %v", err)
	}
	advertise := *raftBind
	for _, s := range servers {
		if string(s.ID) == *id && advertise == "" {
			advertise = string(s.Address)
		}
	}
	if *id == "" || advertise == "" {
		log.Fatalf("raftkv: --id %q is not one of --peers %q", *id, *peers)
	}

	conf := raft.DefaultConfig()
	conf.LocalID = raft.ServerID(*id)
	conf.HeartbeatTimeout = *heartbeat
	conf.ElectionTimeout = *election
	conf.LeaderLeaseTimeout = *lease
	conf.CommitTimeout = *commit
	conf.SnapshotThreshold = 1 << 40
	conf.SnapshotInterval = 24 * time.Hour
	conf.LogOutput = os.Stderr
	conf.LogLevel = *raftLog
	if err := raft.ValidateConfig(conf); err != nil {
		log.Fatalf("raftkv: raft config: %v", err)
	}

	addr, err := net.ResolveTCPAddr("tcp", advertise)
	if err != nil {
		log.Fatalf("raftkv: raft address %q: %v", advertise, err)
	}
	transport, err := raft.NewTCPTransport(advertise, addr, 3, 2*time.Second, os.Stderr)
	if err != nil {
		log.Fatalf("raftkv: raft transport on %s: %v", advertise, err)
	}
	logs := raft.NewInmemStore()
	snaps := raft.NewInmemSnapshotStore()
	fsm := &store{data: map[string]string{}}
	if err := raft.BootstrapCluster(conf, logs, logs, snaps, transport,
		raft.Configuration{Servers: servers}); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
		log.Fatalf("raftkv: bootstrap: %v", err)
	}
	r, err := raft.NewRaft(conf, fsm, logs, logs, snaps, transport)
	if err != nil {
		log.Fatalf("raftkv: raft: %v", err)
	}
	s := &server{id: *id, raft: r, fsm: fsm, verifyLeader: *verify, applyTimeout: *applyTimeout,
		readLease: *readLease, renewEvery: *renewEvery}
	go s.watchLeadership()
	if !*verify {
		go s.renewLease()
	}
	log.Printf("raftkv %s: raft on %s, HTTP on %s, verify-leader=%v, read-lease=%v, peers %s",
		*id, advertise, *httpBind, *verify, *readLease, *peers)
	if err := http.ListenAndServe(*httpBind, s.routes()); err != nil {
		log.Fatalf("raftkv: HTTP on %s: %v", *httpBind, err)
	}
}
