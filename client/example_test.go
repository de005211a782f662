package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/nats-io/nats.go"

	"github.com/hotcount/hotcount/client"
	"github.com/hotcount/hotcount/config"
)

// A producer publishes mentions with a Publisher, and an app reads the
// totals back with a Reader. Here both talk to a sidecar in JetStream
// mode on this machine, as `hotcount dev` runs it.
func Example() {
	hc, stop := example(config.ModeJetStream) // NATS with JetStream, and a sidecar
	defer stop()
	ctx := context.Background()

	// The producer: one connection and one Publisher for the process.
	nc, err := nats.Connect(hc.natsURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	pub, err := client.NewPublisher(nc)
	if err != nil {
		log.Fatal(err)
	}
	for range 3 {
		if err := pub.Mention(ctx, "golang", 1); err != nil {
			log.Fatal(err)
		}
	}
	if err := pub.Mention(ctx, "eu.west.k8s", 5); err != nil {
		log.Fatal(err)
	}
	// Close publishes what the Publisher holds (one message per topic)
	// and waits for the stream's acknowledgements.
	if err := pub.Close(ctx); err != nil {
		log.Fatal(err)
	}

	hc.written(8) // the sidecar writes what it took in every --flush-interval

	// The app: a Reader of the sidecar's lookup API (client.DefaultURL
	// for a sidecar with its defaults).
	rd, err := client.NewReader(hc.httpURL)
	if err != nil {
		log.Fatal(err)
	}
	totals, err := rd.Totals(ctx, []string{"golang", "eu.west.k8s", "rust"})
	if err != nil {
		log.Fatal(err)
	}
	for _, t := range totals {
		fmt.Println(t.Topic, t.Count)
	}
	// Output:
	// golang 3
	// eu.west.k8s 5
	// rust 0
}

// A sidecar run with --http-token-file answers only requests that carry
// its token; the Reader's errors say what went wrong.
func ExampleReader_Total() {
	token := "0123456789abcdef0123456789abcdef"
	hc, stop := example(config.ModeCore, withTokenFile(token)) // a sidecar run with --http-token-file
	defer stop()
	ctx := context.Background()

	rd, err := client.NewReader(hc.httpURL, client.WithToken(token))
	if err != nil {
		log.Fatal(err)
	}
	t, err := rd.Total(ctx, "golang", client.WithConsistency(client.Strong))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(t.Topic, t.Count, t.Source)

	anonymous, err := client.NewReader(hc.httpURL)
	if err != nil {
		log.Fatal(err)
	}
	_, err = anonymous.Total(ctx, "golang")
	var apiErr *client.Error
	if errors.As(err, &apiErr) {
		fmt.Println(apiErr.StatusCode, apiErr.Reason, errors.Is(err, client.ErrUnauthorized))
	}

	_, err = rd.Total(ctx, "")
	fmt.Println(errors.Is(err, client.ErrInvalidTopic))
	// Output:
	// golang 0 store
	// 401 missing Authorization: Bearer <token> true
	// true
}

// Without JetStream, a Publisher sends core NATS messages: at-most-once.
// Close (or Flush) returns once the NATS server has read them; a sidecar
// subscribed then counts them.
func ExampleWithCoreNATS() {
	hc, stop := example(config.ModeCore) // NATS, and a sidecar in core mode
	defer stop()
	ctx := context.Background()

	nc, err := nats.Connect(hc.natsURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	pub, err := client.NewPublisher(nc, client.WithCoreNATS())
	if err != nil {
		log.Fatal(err)
	}
	for _, n := range []int64{2, 40} {
		if err := pub.Mention(ctx, "golang", n); err != nil {
			log.Fatal(err)
		}
	}
	if err := pub.Close(ctx); err != nil {
		log.Fatal(err)
	}

	hc.written(42)
	rd, err := client.NewReader(hc.httpURL)
	if err != nil {
		log.Fatal(err)
	}
	t, err := rd.Total(ctx, "golang")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(t.Topic, t.Count)
	// Output: golang 42
}
