// A stock Go client publishing for the replication proof (bench/replication_proof.py
// --client=go-nsq): go-nsq's Producer, as Go applications publish to nsqd.
//
//	proofpublisher 127.0.0.1:4150 0
//
// The same contract as bench/proof_publisher.py: the proof's batches (a PUB of one body, or an
// MPUB of five: m%09d numbered from the second argument) go to topic "proof" from LANES
// goroutines sharing the Producer's one connection, and each batch's bodies are printed on one
// line of standard output once its OK is in: what is printed is exactly what nsqd
// acknowledged. A refused publish is tried again with new bodies after 50 ms; once nsqd cannot
// be reached at all (the proof killed it) the publisher exits 0, and after 30 s without an
// acknowledged publish it exits 2.
package main

import (
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nsqio/go-nsq"
)

const (
	topic    = "proof"
	lanes    = 4
	retry    = 50 * time.Millisecond
	patience = 30 * time.Second
)

type batches struct {
	mu     sync.Mutex
	seq    int
	addr   string
	lastOK time.Time
}

func (b *batches) next() [][]byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 5
	if b.seq%3 == 0 {
		n = 1
	}
	bodies := make([][]byte, n)
	for i := range bodies {
		bodies[i] = []byte(fmt.Sprintf("m%09d", b.seq+i))
	}
	b.seq += n
	return bodies
}

func (b *batches) acked(bodies [][]byte) {
	parts := make([]string, len(bodies))
	for i, body := range bodies {
		parts[i] = string(body)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	os.Stdout.WriteString(strings.Join(parts, " ") + "\n")
	b.lastOK = time.Now()
}

// gone is true once nsqd refuses connections (it was killed); a refused publish is not that.
func (b *batches) gone() bool {
	conn, err := net.DialTimeout("tcp", b.addr, 2*time.Second)
	if err != nil {
		return true
	}
	conn.Close()
	b.mu.Lock()
	waited := time.Since(b.lastOK)
	b.mu.Unlock()
	if waited > patience {
		fmt.Fprintf(os.Stderr, "publishes refused for %.0f s\n", patience.Seconds())
		os.Exit(2)
	}
	return false
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: proofpublisher HOST:PORT FIRST_NUMBER")
		os.Exit(2)
	}
	start, err := strconv.Atoi(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "FIRST_NUMBER:", err)
		os.Exit(2)
	}
	b := &batches{seq: start, addr: os.Args[1], lastOK: time.Now()}
	producer, err := nsq.NewProducer(b.addr, nsq.NewConfig())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	producer.SetLogger(log.New(io.Discard, "", 0), nsq.LogLevelError)
	var wg sync.WaitGroup
	for i := 0; i < lanes; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				bodies := b.next()
				var err error
				if len(bodies) == 1 {
					err = producer.Publish(topic, bodies[0])
				} else {
					err = producer.MultiPublish(topic, bodies)
				}
				if err == nil {
					b.acked(bodies)
					continue
				}
				if b.gone() {
					return
				}
				time.Sleep(retry)
			}
		}()
	}
	wg.Wait()
	producer.Stop()
}
