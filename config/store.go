package config

import (
	"regexp"

	"github.com/hotcount/hotcount/schema"
)

// storeFlags say which store the counts are written to, and where.
var storeFlags = []setting{
	{name: "store", usage: "store: dynamodb, or bolt (embedded, in --data-dir)", bind: str(func(c *Config) *string { return &c.Store })},
	{name: "table", usage: "DynamoDB table", bind: str(func(c *Config) *string { return &c.Table })},
	{name: "dynamodb-endpoint", usage: "DynamoDB endpoint URL (empty: AWS's own; set for dynalite, DynamoDB Local, LocalStack)", bind: str(func(c *Config) *string { return &c.DynamoDBEndpoint })},
	{name: "region", usage: "on a DynamoDB global table: the Region whose own shards this sidecar writes (no two Regions write one item, so last-writer-wins replication loses nothing); empty: the AWS Region the SDK resolves, when DescribeTable lists replicas or --regions is set, else the single-Region layout", bind: str(func(c *Config) *string { return &c.Region })},
	{name: "regions", usage: "every Region that writes the table, comma-separated, read by every total (needed where DescribeTable lists no replicas: DynamoDB Local, dynalite, a policy without dynamodb:DescribeTable); the table's replicas are added", bind: str(func(c *Config) *string { return &c.Regions })},
	{name: "data-dir", usage: "folder of the embedded store (--store bolt)", bind: str(func(c *Config) *string { return &c.DataDir })},
}

// tableName is DynamoDB's rule for table names.
var tableName = regexp.MustCompile(`^[a-zA-Z0-9_.-]{3,255}$`)

// checkStore checks the store kind and where its data lives.
func (c *Config) checkStore(p *problems) {
	switch c.Store {
	case StoreDynamoDB:
		if !tableName.MatchString(c.Table) {
			p.bad("table", "%q is not a DynamoDB table name (3..255 of a-z A-Z 0-9 _ . -)", c.Table)
		}
		for _, r := range c.RegionList() {
			if err := schema.ValidateRegion(r); err != nil {
				p.bad("regions", "%v", err)
			}
		}
		if c.Region != "" {
			if err := schema.ValidateRegion(c.Region); err != nil {
				p.bad("region", "%v", err)
			}
		}
	case StoreBolt:
		if c.DataDir == "" {
			p.bad("data-dir", "must not be empty with --store bolt")
		}
		if c.Region != "" || c.Regions != "" {
			p.bad("region", "Regions are a DynamoDB global table's; the embedded store has one")
		}
	default:
		p.bad("store", "%q is not %s or %s", c.Store, StoreDynamoDB, StoreBolt)
	}
}
