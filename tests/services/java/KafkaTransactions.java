// Lists a Kafka cluster's transactions with the Admin API (ListTransactions, then
// DescribeTransactions), which confluent-kafka does not offer. Run from source by
// tests/services/kafka.py (Kafka.transactions) on the broker's own classpath:
//   java -cp '<kafka lib>/*' KafkaTransactions.java <bootstrap servers>
// Prints one tab-separated line per transaction:
//   transactional id, state, producer id, producer epoch, coordinator id,
//   start time in ms (-1 if none), timeout in ms, partitions (topic:partition, comma-separated)
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionListing;

public class KafkaTransactions {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("request.timeout.ms", "10000");
        props.put("default.api.timeout.ms", "20000");
        try (Admin admin = Admin.create(props)) {
            List<String> ids = new ArrayList<>();
            for (TransactionListing listing : admin.listTransactions().all().get()) {
                ids.add(listing.transactionalId());
            }
            if (ids.isEmpty()) {
                return;
            }
            Map<String, TransactionDescription> described =
                admin.describeTransactions(ids).all().get();
            for (Map.Entry<String, TransactionDescription> entry : described.entrySet()) {
                TransactionDescription d = entry.getValue();
                String partitions = d.topicPartitions().stream()
                    .map(tp -> tp.topic() + ":" + tp.partition())
                    .sorted()
                    .collect(Collectors.joining(","));
                System.out.println(String.join("\t",
                    entry.getKey(),
                    d.state().toString(),
                    Long.toString(d.producerId()),
                    Integer.toString(d.producerEpoch()),
                    Integer.toString(d.coordinatorId()),
                    Long.toString(d.transactionStartTimeMs().orElse(-1L)),
                    Long.toString(d.transactionTimeoutMs()),
                    partitions));
            }
        }
    }
}
