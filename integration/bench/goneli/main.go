// Command goneli-member runs one goNELI member for integration/bench/peers.py.
//
// It is this project's benchmark driver, not goNELI: peers.py fetches goNELI through the Go
// module proxy into a temporary module and builds this file against it. Protocol: settings as
// JSON in argv[1]; JSON lines on stdout ("ready", "event"); "release" on stdin closes the
// member (LeaveGroup). Times are Unix nanoseconds (the wall clock all peers share).
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/obsidiandynamics/goneli"
)

type settings struct {
	Bootstrap         string `json:"bootstrap"`
	Group             string `json:"group"`
	Topic             string `json:"topic"`
	Name              string `json:"name"`
	HeartbeatTimeoutS float64 `json:"heartbeat_timeout_s"`
	GroupHeartbeatMS  int    `json:"group_heartbeat_ms"`
}

var mu sync.Mutex

func emit(fields map[string]interface{}) {
	mu.Lock()
	defer mu.Unlock()
	line, _ := json.Marshal(fields)
	fmt.Println(string(line))
}

func now() float64 { return float64(time.Now().UnixNano()) / 1e9 }

func main() {
	var s settings
	if err := json.Unmarshal([]byte(os.Args[1]), &s); err != nil {
		panic(err)
	}
	begin := now()
	barrier := func(e goneli.Event) {
		kind := ""
		switch e.(type) {
		case goneli.LeaderAcquired:
			kind = "acquired"
		case goneli.LeaderRevoked:
			kind = "revoked"
		case goneli.LeaderFenced:
			kind = "fenced"
		}
		emit(map[string]interface{}{"kind": kind, "t": now()})
	}
	timeout := time.Duration(s.HeartbeatTimeoutS * float64(time.Second))
	neli, err := goneli.New(goneli.Config{
		KafkaConfig: goneli.KafkaConfigMap{
			"bootstrap.servers":     s.Bootstrap,
			"heartbeat.interval.ms": s.GroupHeartbeatMS,
		},
		LeaderGroupID:    s.Group,
		LeaderTopic:      s.Topic,
		Name:             s.Name,
		HeartbeatTimeout: &timeout,
	}, barrier)
	if err != nil {
		panic(err)
	}
	emit(map[string]interface{}{"kind": "ready", "t": now(), "start_s": now() - begin})
	// goNELI's own background pulser, as its README shows: the task is a bit of leader work.
	if _, err := neli.Background(func() { time.Sleep(10 * time.Millisecond) }); err != nil {
		panic(err)
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "release" {
			break
		}
	}
	emit(map[string]interface{}{"kind": "releasing", "t": now()})
	neli.Close()
	neli.Await()
	emit(map[string]interface{}{"kind": "closed", "t": now()})
}
